package testkit

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// FailFirstCommit makes the first commit of a transaction that did event
// ("INSERT", "UPDATE", …) on table, to a row for which when holds (a
// trigger's WHEN condition on NEW and OLD; "" for every row), fail — as a
// commit lost to a Postgres restart fails after every statement before it
// succeeded. A failing commit cannot be caused otherwise: a deferred
// constraint trigger raises at the commit. name names the trigger and its
// function, one per call.
func FailFirstCommit(t testing.TB, db *pgxpool.Pool, name, event, table, when string) {
	t.Helper()
	cond := ""
	if when != "" {
		cond = "WHEN (" + when + ") "
	}
	_, err := db.Exec(context.Background(), `
		CREATE SEQUENCE `+name+`_commits;
		CREATE FUNCTION `+name+`() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
		  IF nextval('`+name+`_commits') = 1 THEN
		    RAISE EXCEPTION 'the first commit fails (testkit.FailFirstCommit %s)', '`+name+`';
		  END IF;
		  RETURN NULL;
		END $$;
		CREATE CONSTRAINT TRIGGER `+name+` AFTER `+event+` ON `+table+`
		  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW `+cond+`EXECUTE FUNCTION `+name+`();`)
	if err != nil {
		t.Fatalf("testkit.FailFirstCommit %s: %v", name, err)
	}
}
