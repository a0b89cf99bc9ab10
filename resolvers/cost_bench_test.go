package resolvers

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/executor"

	"sandboxd/graph"
)

// BenchmarkCostPrice is what pricing adds to an operation: a dashboard page, and the 200-alias
// readFile storm that is refused.
func BenchmarkCostPrice(b *testing.B) {
	exec := executor.New(graph.NewExecutableSchema(graph.Config{Resolvers: &Resolver{}}))
	budget := &costBudget{points: DefaultCostLimit, readBytes: DefaultMaxReadBytes, mutations: DefaultMaxMutationFields,
		fileBytes: maxReadFileBytes, outputBytes: DefaultOutputFieldBytes}
	var storm strings.Builder
	storm.WriteString("{")
	for i := range 200 {
		fmt.Fprintf(&storm, `a%d: readFile(sandboxId: "sbx_1", path: "big.bin") { contentBase64 } `, i)
	}
	storm.WriteString("}")
	for _, q := range []struct{ name, query string }{
		{"page", `{ sandboxes(first: 100) { edges { cursor node { id state profileName createdAt autostopAt resources { milliCpu memoryBytes diskBytes } } } pageInfo { hasNextPage endCursor } } }`},
		{"storm-200-aliases", storm.String()},
	} {
		b.Run(q.name, func(b *testing.B) {
			ctx := graphql.StartOperationTrace(context.Background())
			oc, errs := exec.CreateOperationContext(ctx, &graphql.RawParams{Query: q.query})
			if errs != nil {
				b.Fatal(errs)
			}
			b.ReportAllocs()
			for b.Loop() {
				budget.price(oc)
			}
		})
	}
}
