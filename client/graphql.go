package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Cost is the price of a GraphQL operation (extensions.cost).
type Cost struct {
	Points         int64 `json:"points"`
	PointsLimit    int64 `json:"pointsLimit"`
	Bytes          int64 `json:"bytes"`
	BytesLimit     int64 `json:"bytesLimit"`
	Mutations      int64 `json:"mutations"`
	MutationsLimit int64 `json:"mutationsLimit"`
}

// Response is what a GraphQL answer carries besides its data.
type Response struct {
	// Cost is extensions.cost; nil when the answer had none.
	Cost *Cost
	// Extensions are the answer's extensions, cost included.
	Extensions map[string]json.RawMessage
}

// gqlError is one GraphQL error as it travels.
type gqlError struct {
	Message    string         `json:"message"`
	Path       []any          `json:"path"`
	Extensions map[string]any `json:"extensions"`
}

// graphQLError makes a *Error of an answer's errors (nil for none); status is the answer's.
func graphQLError(status int, retryAfter string, errs []gqlError) *Error {
	var out *Error
	for _, ge := range errs {
		e := &Error{Status: status, Message: ge.Message, Path: ge.Path}
		for k, v := range ge.Extensions {
			switch k {
			case "code":
				e.Code, _ = v.(string)
			case "retryAfter":
				if s, ok := v.(float64); ok {
					e.RetryAfter = time.Duration(s) * time.Second
				}
			default:
				if e.Details == nil {
					e.Details = map[string]any{}
				}
				e.Details[k] = v
			}
		}
		if s, err := strconv.Atoi(retryAfter); err == nil && e.RetryAfter == 0 && s > 0 {
			e.RetryAfter = time.Duration(s) * time.Second
		}
		if out == nil {
			out = e
		} else {
			out.More = append(out.More, e)
		}
	}
	return out
}

// Do runs a GraphQL query or mutation (POST /graphql) and decodes its data into out (nil:
// discarded). GraphQL errors answer a *Error with extensions.code as Code and
// extensions.retryAfter as RetryAfter (the first error; the others in More); data that came
// with them is still decoded into out. The Response carries extensions.cost.
func (c *Client) Do(ctx context.Context, query string, vars map[string]any, out any) (*Response, error) {
	body, err := json.Marshal(map[string]any{"query": query, "variables": vars})
	if err != nil {
		return nil, err
	}
	req, err := c.request(ctx, http.MethodPost, GraphQLPath, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/graphql-response+json, application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("client: reading the GraphQL answer: %w", err)
	}
	var a struct {
		Data       json.RawMessage            `json:"data"`
		Errors     []gqlError                 `json:"errors"`
		Extensions map[string]json.RawMessage `json:"extensions"`
	}
	if err := json.Unmarshal(raw, &a); err != nil {
		if resp.StatusCode/100 != 2 {
			return nil, &Error{Status: resp.StatusCode, Message: truncate(string(raw))}
		}
		return nil, fmt.Errorf("client: decoding the GraphQL answer %q: %w", truncate(string(raw)), err)
	}
	r := &Response{Extensions: a.Extensions}
	if cost, ok := a.Extensions["cost"]; ok {
		r.Cost = new(Cost)
		if err := json.Unmarshal(cost, r.Cost); err != nil {
			r.Cost = nil
		}
	}
	if out != nil && len(a.Data) > 0 && string(a.Data) != "null" {
		if err := json.Unmarshal(a.Data, out); err != nil {
			return r, fmt.Errorf("client: decoding the GraphQL data: %w", err)
		}
	}
	if e := graphQLError(resp.StatusCode, resp.Header.Get("Retry-After"), a.Errors); e != nil {
		return r, e
	}
	if resp.StatusCode/100 != 2 {
		return r, &Error{Status: resp.StatusCode, Message: truncate(string(raw))}
	}
	return r, nil
}

func truncate(s string) string {
	if len(s) > 500 {
		return s[:500] + "…"
	}
	return s
}
