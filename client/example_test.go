package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"time"

	"sandboxd/client"
)

// Create a sandbox, run a command, stop and start it (the workspace survives), destroy it.
func Example() {
	ctx := context.Background()
	c, err := client.New() // SANDBOX_GATEWAY_URL and SANDBOX_API_KEY
	if err != nil {
		log.Fatal(err)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Profile: "sandboxes-default",
		AutostopSec: client.Ptr[int64](1800), TTLSec: client.Ptr[int64](14400)})
	if err != nil {
		log.Fatal(err)
	}
	res, err := c.Exec(ctx, sb.ID, client.ExecRequest{Command: []string{"bash", "-lc", "echo hi > note && cat note"}})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(res.Stdout)
	if _, err := c.Stop(ctx, sb.ID); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Start(ctx, sb.ID); err != nil {
		log.Fatal(err)
	}
	if _, err := c.Destroy(ctx, sb.ID); err != nil {
		log.Fatal(err)
	}
}

// Errors carry the server's code and Retry-After.
func ExampleError() {
	ctx := context.Background()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.Create(ctx, client.CreateRequest{})
	var e *client.Error
	if errors.As(err, &e) && e.Code == client.CodeQuotaExceeded {
		fmt.Println("project full, retry in", e.RetryAfter)
	}
}

// Start a long command without waiting, then follow its output over REST (SSE). The stream
// resumes by itself after a dropped connection; Cursor lets another process resume later.
func ExampleClient_ExecOutput() {
	ctx := context.Background()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	sandboxID := os.Getenv("SANDBOX_ID")
	st, err := c.ExecDetached(ctx, sandboxID, client.ExecRequest{Command: []string{"bash", "-lc", "make test"},
		TimeoutSec: client.Ptr[int64](3600)})
	if err != nil {
		log.Fatal(err)
	}
	out, err := c.ExecOutput(ctx, sandboxID, st.ExecID, "")
	if err != nil {
		log.Fatal(err)
	}
	defer out.Close()
	for {
		ev, err := out.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			log.Fatal(err)
		}
		switch ev.Kind {
		case client.KindChunk:
			os.Stdout.Write(ev.Data)
		case client.KindTruncated:
			fmt.Printf("[%d bytes no longer kept]\n", ev.MissedBytes)
		case client.KindExit:
			fmt.Println("exit code", ev.Exec.ExitCode)
		}
	}
}

// Follow a command's output over a GraphQL WebSocket. When the connection drops, Next redials
// and subscribes again after the last cursor: no byte is lost or printed twice.
func ExampleClient_SubscribeExecOutput() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.SubscribeExecOutput(ctx, os.Getenv("EXEC_ID"), "")
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	for {
		ev, err := sub.Next()
		if err == io.EOF {
			break // after the EXIT event
		}
		if err != nil {
			log.Fatalf("after cursor %s: %v", sub.Cursor(), err)
		}
		if ev.Kind == "CHUNK" {
			os.Stdout.Write(ev.Data)
		}
	}
	fmt.Fprintln(os.Stderr, "reconnected", sub.Reconnects, "times")
}

// Follow a sandbox's status events, resuming after a cursor saved earlier.
func ExampleClient_SubscribeSandboxEvents() {
	ctx := context.Background()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	sub, err := c.SubscribeSandboxEvents(ctx, os.Getenv("SANDBOX_ID"), os.Getenv("AFTER"))
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	for {
		ev, err := sub.Next()
		if err != nil {
			break
		}
		fmt.Println(ev.Cursor, ev.Type, ev.State)
	}
}

// Run any GraphQL operation and read its price.
func ExampleClient_Do() {
	ctx := context.Background()
	c, err := client.New()
	if err != nil {
		log.Fatal(err)
	}
	var out struct {
		Quota struct{ Limit, InUse int } `json:"quota"`
	}
	resp, err := c.Do(ctx, `{ quota { limit inUse } }`, nil, &out)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(out.Quota.InUse, "of", out.Quota.Limit, "slots; cost", resp.Cost.Points, "points")
}
