// Package e2e holds the end-to-end tests: the wake-up round trip through
// real PostgreSQL and a real Temporal server running in process. It is the
// one package that links the Temporal server (which takes minutes to build),
// so every test that needs Temporal lives here.
package e2e
