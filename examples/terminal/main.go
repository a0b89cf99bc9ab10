// Command terminal attaches to an exec's terminal over the REST terminal WebSocket and copies
// its own stdin to the exec and the exec's output to its stdout, byte for byte, until the exec
// ends (it then exits with the exec's exit code) or it is interrupted (it then detaches, the
// exec runs on, and it prints the cursor to reattach after):
//
//	printf 'ls\nexit 3\n' | go run ./examples/terminal -sandbox sbx_… -exec exec_…
//	go run ./examples/terminal -sandbox sbx_… -exec exec_… -after 1234-0   # reattach
//
// It takes the gateway and the key from SANDBOX_GATEWAY_URL and SANDBOX_API_KEY. It does not
// put the local terminal in raw mode (sandboxctl terminal does): it is a pipe to the exec's
// terminal. With -eof, the end of its stdin closes the exec's stdin (a shell then exits).
// Dropped connections are the public client's business: Terminal reattaches after the last
// cursor it received.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"

	"sandboxd/client"
)

func main() {
	sandbox := flag.String("sandbox", "", "the sandbox")
	execID := flag.String("exec", "", "the exec to attach to (one started with tty or stdin_open)")
	after := flag.String("after", "", "start with the output after this cursor (default: all the output kept)")
	eof := flag.Bool("eof", false, "close the exec's stdin when this command's stdin ends")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	code, err := run(ctx, *sandbox, *execID, *after, *eof)
	if err != nil {
		fmt.Fprintln(os.Stderr, "terminal:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

func run(ctx context.Context, sandbox, execID, after string, eof bool) (int, error) {
	if sandbox == "" || execID == "" {
		return 0, errors.New("give -sandbox and -exec")
	}
	c, err := client.New()
	if err != nil {
		return 0, err
	}
	term, err := c.Terminal(ctx, sandbox, execID, client.TerminalOptions{After: after,
		OnError: func(err error) { fmt.Fprintln(os.Stderr, "terminal: refused:", err) }})
	if err != nil {
		return 0, err
	}
	defer term.Close()
	go func() {
		if _, err := io.Copy(term, os.Stdin); err == nil && eof {
			_ = term.CloseStdin()
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(os.Stdout, term)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return 0, err
		}
	case <-ctx.Done():
		_ = term.Close()
		<-done
		fmt.Fprintf(os.Stderr, "\nterminal: detached; reattach with -after %s\n", term.Cursor())
		return 0, nil
	}
	x := term.Exit()
	if x == nil {
		return 0, errors.New("the terminal ended without the exec's exit")
	}
	if x.Error != "" {
		fmt.Fprintln(os.Stderr, "terminal:", x.Error)
	}
	return x.ExitCode, nil
}
