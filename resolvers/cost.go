package resolvers

import (
	"context"
	"fmt"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"sandboxd/internal/apierror"
	"sandboxd/internal/netpolicy"
)

// The price of a GraphQL operation, computed from its document and variables after validation
// and before anything runs. An operation over any budget is refused whole with COST_EXCEEDED;
// every answer carries its price in extensions.cost.
//
//   - Points: every selected field costs 1, times the number of objects it may be selected on.
//     A list field multiplies its selection by the most items it may return: first for
//     the connections sandboxes, snapshots, agentRuns and execs and for listFiles, limits.max_labels
//     for a sandbox's labels, the number of ids for nodes. Each mutation and subscription root field costs mutationPoints
//     more, and each Query field that calls a guest init or scans an index of execs (readFile,
//     listFiles, stat, execs) backendPoints more. Each byte field below adds a point
//     per bytesPerPoint bytes.
//   - Bytes: the most bytes the operation may read into its answer. readFile reserves its
//     maxBytes (the file cap by default); each output field of ExecResult (stdout, stderr and
//     their base64 forms) reserves the exec output cap. Aliases are counted one by one, so 200
//     aliased readFile fields reserve 200 files.
//   - Mutation fields: an operation may hold at most MaxMutationFields mutation root fields.
//
// Aliases, fragments and @skip/@include are resolved as the executor would.
const (
	// mutationPoints is what each mutation and subscription root field costs besides its
	// selection: each starts work or a stream.
	mutationPoints = 10
	// backendPoints is what each Query field that calls a sandbox's guest init or scans an
	// index (backendQueryFields) costs besides its selection, so that aliases cannot turn one
	// cheap-looking operation into thousands of guest calls.
	backendPoints = 25
	// bytesPerPoint prices byte fields in points.
	bytesPerPoint = 64 << 10
)

// backendQueryFields are the Query fields that reach a sandbox's guest init (files) or scan
// an index of execs; each costs backendPoints more.
var backendQueryFields = map[string]bool{"readFile": true, "listFiles": true, "stat": true, "execs": true}

// Defaults of the cost budgets.
const (
	DefaultCostLimit         = 10_000
	DefaultMaxReadBytes      = 16 << 20
	DefaultMaxMutationFields = 10
	DefaultOutputFieldBytes  = 1 << 20
)

// costBudget prices operations and refuses those over budget.
type costBudget struct {
	points       int64
	readBytes    int64
	mutations    int
	fileBytes    int64 // what readFile reserves without maxBytes
	outputBytes  int64 // what one ExecResult output field reserves
	listDefaults map[string]int64
}

// cost is an operation's price.
type cost struct {
	Points    int64 `json:"points"`
	Bytes     int64 `json:"bytes"`
	Mutations int   `json:"mutations,omitempty"`
}

var (
	_ graphql.HandlerExtension        = (*costBudget)(nil)
	_ graphql.OperationContextMutator = (*costBudget)(nil)
	_ graphql.ResponseInterceptor     = (*costBudget)(nil)
)

func (b *costBudget) ExtensionName() string                   { return "CostBudget" }
func (b *costBudget) Validate(graphql.ExecutableSchema) error { return nil }
func (b *costBudget) InterceptResponse(ctx context.Context, next graphql.ResponseHandler) *graphql.Response {
	resp := next(ctx)
	if resp == nil {
		return nil
	}
	if c, ok := costOf(ctx); ok && graphql.GetOperationContext(ctx).Operation.Operation != ast.Subscription {
		// Not on subscription events: a price per output chunk would cost more than it says.
		if resp.Extensions == nil {
			resp.Extensions = map[string]any{}
		}
		if _, set := resp.Extensions["cost"]; !set {
			resp.Extensions["cost"] = b.report(*c)
		}
	}
	return resp
}

func (b *costBudget) report(c cost) map[string]any {
	return map[string]any{"points": c.Points, "pointsLimit": b.points, "bytes": c.Bytes, "bytesLimit": b.readBytes,
		"mutations": c.Mutations, "mutationsLimit": b.mutations}
}

// MutateOperationContext prices the operation and refuses it when it is over a budget.
func (b *costBudget) MutateOperationContext(ctx context.Context, oc *graphql.OperationContext) *gqlerror.Error {
	if oc.Operation == nil {
		return nil
	}
	c := b.price(oc)
	var e *apierror.Error
	switch {
	case c.Mutations > b.mutations:
		e = apierror.New(apierror.CostExceeded, "the operation has %d mutation fields; at most %d are allowed in one operation",
			c.Mutations, b.mutations)
	case c.Points > b.points:
		e = apierror.New(apierror.CostExceeded, "the operation costs %d points; the limit is %d (ask for smaller pages or fewer fields)",
			c.Points, b.points)
	case c.Bytes > b.readBytes:
		e = apierror.New(apierror.CostExceeded, "the operation may read %d bytes; the limit is %d (lower readFile maxBytes, or read fewer files or outputs)",
			c.Bytes, b.readBytes)
	}
	if e != nil {
		return gqlError(e.WithDetail("cost", b.report(c)))
	}
	setCost(oc, c)
	return nil
}

// setCost records the price where the response interceptor finds it.
func setCost(oc *graphql.OperationContext, c cost) {
	oc.Stats.SetExtension("cost", &c)
}

// costOf is the price recorded for the operation in ctx, if any.
func costOf(ctx context.Context) (*cost, bool) {
	if !graphql.HasOperationContext(ctx) {
		return nil, false
	}
	c, ok := graphql.GetOperationContext(ctx).Stats.GetExtension("cost").(*cost)
	return c, ok
}

// price walks the operation's selection.
func (b *costBudget) price(oc *graphql.OperationContext) cost {
	var c cost
	root := oc.Operation.SelectionSet
	switch oc.Operation.Operation {
	case ast.Mutation:
		c.Mutations = b.countRoot(root, oc.Variables)
		c.Points += int64(c.Mutations) * mutationPoints
	case ast.Subscription:
		c.Points += int64(b.countRoot(root, oc.Variables)) * mutationPoints
	}
	b.walk(&c, root, oc.Variables, 1)
	return c
}

// countRoot counts the root fields of an operation, through fragments.
func (b *costBudget) countRoot(set ast.SelectionSet, vars map[string]any) int {
	n := 0
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if included(s.Directives, vars) {
				n++
			}
		case *ast.InlineFragment:
			if included(s.Directives, vars) {
				n += b.countRoot(s.SelectionSet, vars)
			}
		case *ast.FragmentSpread:
			if included(s.Directives, vars) && s.Definition != nil {
				n += b.countRoot(s.Definition.SelectionSet, vars)
			}
		}
	}
	return n
}

// walk adds the price of set, selected on mult objects.
func (b *costBudget) walk(c *cost, set ast.SelectionSet, vars map[string]any, mult int64) {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			if !included(s.Directives, vars) {
				continue
			}
			c.Points = satAdd(c.Points, mult)
			if s.Definition == nil || s.ObjectDefinition == nil {
				continue
			}
			if s.ObjectDefinition.Name == "Query" && backendQueryFields[s.Name] {
				c.Points = satAdd(c.Points, satMul(backendPoints, mult))
			}
			args := s.ArgumentMap(vars)
			if n := b.fieldBytes(s.ObjectDefinition.Name, s.Name, args); n > 0 {
				total := satMul(n, mult)
				c.Bytes = satAdd(c.Bytes, total)
				c.Points = satAdd(c.Points, (total+bytesPerPoint-1)/bytesPerPoint)
			}
			items := satMul(mult, b.listSize(s.ObjectDefinition.Name, s.Name, args))
			if connectionFields[s.ObjectDefinition.Name+"."+s.Name] {
				b.walkConnection(c, s.SelectionSet, vars, mult, items)
			} else {
				b.walk(c, s.SelectionSet, vars, items)
			}
		case *ast.InlineFragment:
			if included(s.Directives, vars) {
				b.walk(c, s.SelectionSet, vars, mult)
			}
		case *ast.FragmentSpread:
			if included(s.Directives, vars) && s.Definition != nil {
				b.walk(c, s.Definition.SelectionSet, vars, mult)
			}
		}
	}
}

// connectionFields return a page (a Relay-style connection): only its edges and nodes are
// resolved once per item, the rest (pageInfo, path, the events cursor) once per page.
var connectionFields = map[string]bool{
	"Query.sandboxes": true, "Query.listFiles": true, "Query.snapshots": true, "Query.execs": true, "Query.agentRuns": true,
}

// walkConnection adds the price of a connection's selection set, selected on mult pages of at
// most items/mult items each.
func (b *costBudget) walkConnection(c *cost, set ast.SelectionSet, vars map[string]any, mult, items int64) {
	for _, sel := range set {
		switch s := sel.(type) {
		case *ast.Field:
			m := mult
			if s.Name == "edges" || s.Name == "nodes" {
				m = items
			}
			b.walk(c, ast.SelectionSet{s}, vars, m)
		case *ast.InlineFragment:
			if included(s.Directives, vars) {
				b.walkConnection(c, s.SelectionSet, vars, mult, items)
			}
		case *ast.FragmentSpread:
			if included(s.Directives, vars) && s.Definition != nil {
				b.walkConnection(c, s.Definition.SelectionSet, vars, mult, items)
			}
		}
	}
}

// listSize is how many items a field's selection may be resolved on.
func (b *costBudget) listSize(typeName, field string, args map[string]any) int64 {
	key := typeName + "." + field
	if connectionFields[key] {
		if n, ok := intArg(args, "first"); ok && n > 0 {
			return n
		}
		return b.listDefaults[key]
	}
	switch key {
	case "Query.nodes":
		// One per id asked for.
		if ids, ok := args["ids"].([]any); ok {
			return int64(len(ids))
		}
		return MaxNodes
	case "Sandbox.labels":
		// The most labels a sandbox may have (limits.max_labels).
		return b.listDefaults[key]
	case "NetworkPolicy.pinned":
		// One per host name an allow list may hold.
		return netpolicy.MaxEntries
	}
	return 1
}

// fieldBytes is what a byte field reserves, 0 for other fields.
func (b *costBudget) fieldBytes(typeName, field string, args map[string]any) int64 {
	switch typeName + "." + field {
	case "Query.readFile":
		if n, ok := intArg(args, "maxBytes"); ok && n > 0 && n < b.fileBytes {
			return n
		}
		return b.fileBytes
	case "ExecResult.stdout", "ExecResult.stderr", "ExecResult.stdoutBase64", "ExecResult.stderrBase64":
		return b.outputBytes
	}
	return 0
}

// intArg reads an integer argument (coerced values are int64; variables may be other kinds).
func intArg(args map[string]any, name string) (int64, bool) {
	switch v := args[name].(type) {
	case int64:
		return v, true
	case int:
		return int64(v), true
	case int32:
		return int64(v), true
	case float64:
		return int64(v), true
	case fmt.Stringer:
		var n int64
		_, err := fmt.Sscan(v.String(), &n)
		return n, err == nil
	}
	return 0, false
}

// included applies @skip and @include.
func included(dirs ast.DirectiveList, vars map[string]any) bool {
	if d := dirs.ForName("skip"); d != nil {
		if v, _ := d.ArgumentMap(vars)["if"].(bool); v {
			return false
		}
	}
	if d := dirs.ForName("include"); d != nil {
		if v, _ := d.ArgumentMap(vars)["if"].(bool); !v {
			return false
		}
	}
	return true
}

const maxInt64 = 1<<63 - 1

func satAdd(a, b int64) int64 {
	if a > maxInt64-b {
		return maxInt64
	}
	return a + b
}

func satMul(a, b int64) int64 {
	if a == 0 || b == 0 {
		return 0
	}
	if a > maxInt64/b {
		return maxInt64
	}
	return a * b
}
