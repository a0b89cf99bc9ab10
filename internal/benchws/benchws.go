// Package benchws is the workspace the stop, start and restore benchmarks measure (sandbox-bench's
// stopstart suite, the kube runtime's BenchmarkWorkspaceExport, tests' TestStopBench), made by
// one script inside a sandbox so that every benchmark reads the same files.
package benchws

// Script is python3 source: it writes argv[1] bytes in argv[2] files under
// /workspace/bench-data, 100 files a folder: every third file random bytes, the others text cut
// from a corpus of random words (compressible). It prints "<files> <bytes>".
const Script = `import os, random, sys
total, n = int(sys.argv[1]), int(sys.argv[2])
rnd = random.Random(8)
words = ("the quick brown fox jumps over a lazy dog while sandbox workspace python import def return "
         "class self print value error test assert module package install build run exec start stop "
         "checkpoint restore tenant project profile stream").split()
corpus = "\n".join(" ".join(rnd.choice(words) for _ in range(12)) for _ in range(60000)).encode()
per = max(total // n, 1)
written = 0
for i in range(n):
    d = "/workspace/bench-data/d%03d" % (i // 100)
    if i % 100 == 0:
        os.makedirs(d, exist_ok=True)
    size = rnd.randint(per // 2, per * 3 // 2)
    if i % 3 == 0:
        data, ext = os.urandom(size), "bin"
    else:
        off = rnd.randrange(0, max(len(corpus) - size, 1))
        data, ext = corpus[off:off + size], "txt"
    with open("%s/f%05d.%s" % (d, i, ext), "wb") as f:
        f.write(data)
    written += len(data)
print(n, written)
`

// Args are the script's arguments for the benchmarks' usual workspace: 100 MB in 6,000 files.
var Args = []string{"100000000", "6000"}
