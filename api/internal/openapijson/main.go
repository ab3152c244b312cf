// Command openapijson prints the merged OpenAPI document that the server
// serves at /openapi.json, so tools outside Go (CI's linter, client
// generators) read exactly what clients get.
package main

import (
	"fmt"
	"os"

	"github.com/reveille/reveille/api"
)

func main() {
	doc, err := api.OpenAPIDocument()
	if err != nil {
		fmt.Fprintln(os.Stderr, "openapijson:", err)
		os.Exit(1)
	}
	if _, err := os.Stdout.Write(append(doc, '\n')); err != nil {
		fmt.Fprintln(os.Stderr, "openapijson:", err)
		os.Exit(1)
	}
}
