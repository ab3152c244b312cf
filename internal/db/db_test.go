package db_test

import (
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/reveille/reveille/internal/db"
)

// What the package promises, checked by the compiler.
var (
	_ db.Batcher = pgx.Tx(nil)
	_ db.Batcher = (*pgxpool.Pool)(nil)
	_ db.Batcher = (*pgx.Conn)(nil)
)
