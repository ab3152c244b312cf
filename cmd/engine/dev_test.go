package main

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/reveille/reveille/api"
)

// engine dev's inbox link opens the page signed in as an approver that is
// not the dev user, with the token in the fragment (never sent to a server).
func TestDevInboxLinkCarriesAnApproverTokenInItsFragment(t *testing.T) {
	for _, tc := range []struct{ addr, prefix string }{
		{":8080", "http://localhost:8080/inbox#token="},
		{"127.0.0.1:9090", "http://127.0.0.1:9090/inbox#token="},
	} {
		s := settings{Addr: tc.addr, JWTSecrets: []string{firstSecret}, JWTIssuer: "iss", JWTAudience: "aud"}

		link, err := devInboxLink(s)

		require.NoError(t, err)
		require.True(t, strings.HasPrefix(link, tc.prefix), link)
		var claims api.Claims
		_, err = jwt.ParseWithClaims(strings.TrimPrefix(link, tc.prefix), &claims, func(*jwt.Token) (any, error) { return []byte(firstSecret), nil },
			jwt.WithIssuer("iss"), jwt.WithAudience("aud"), jwt.WithValidMethods([]string{"HS256"}))
		require.NoError(t, err)
		require.Equal(t, devOrg, claims.OrgID)
		require.Equal(t, devApprover, claims.Subject)
		require.NotEqual(t, "dev-user", claims.Subject, "the dev user's own requests stay answerable")
		require.Equal(t, []string{api.RoleApprover}, claims.Roles)
	}
}

// A port flag out of range stops the command as it parses its flags,
// naming the flag, before anything is created or started: engine dev
// --temporal-port -1 ran initdb and started Postgres first. The data dir
// stays empty.
func TestAPortFlagOutOfRangeIsRefusedBeforeAnythingStarts(t *testing.T) {
	for _, tc := range []struct {
		command string
		args    []string
		want    string
	}{
		{"dev", []string{"--temporal-port", "-1"}, `invalid value "-1" for flag -temporal-port: want a port from 1 to 65535 (0: a free one)`},
		{"dev", []string{"--temporal-port=70000"}, `invalid value "70000" for flag -temporal-port`},
		{"dev", []string{"--temporal-port", "seven"}, `invalid value "seven" for flag -temporal-port`},
		{"devstack", []string{"--temporal-port", "65536"}, `invalid value "65536" for flag -temporal-port`},
		{"devstack", []string{"--postgres-port", "-5"}, `invalid value "-5" for flag -postgres-port`},
		{"demo", []string{"--temporal-port", "70000"}, `invalid value "70000" for flag -temporal-port`},
	} {
		t.Run(tc.command+" "+strings.Join(tc.args, " "), func(t *testing.T) {
			clearEnv(t)
			dir := t.TempDir()
			t.Setenv("REVEILLE_DATA_DIR", dir)
			i := slices.IndexFunc(commands(), func(c command) bool { return c.name == tc.command })

			err := commands()[i].run(context.Background(), tc.args)

			require.ErrorContains(t, err, tc.want)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			require.Empty(t, entries, "nothing created in the data dir")
		})
	}
	t.Run("a port in range, or 0 for a free one, is taken", func(t *testing.T) {
		for _, v := range []string{"0", "1", "7233", "65535"} {
			var p int
			require.NoError(t, portFlag{&p}.Set(v), v)
		}
	})
}

// engine dev's banner printed a supplied DATABASE_URL with its password;
// it masks it as pgx's errors do, and keeps the rest, so the local
// cluster's URL (no password) is still one to copy.
func TestTheDevBannerMasksTheDatabasePassword(t *testing.T) {
	for _, tc := range []struct{ name, url, want string }{
		{"the local cluster's URL is kept whole", "postgres://postgres@127.0.0.1:5433/reveille?sslmode=disable",
			"postgres://postgres@127.0.0.1:5433/reveille?sslmode=disable"},
		{"a password in the URL", "postgres://postgres:SECRETPW@db.example.com:5432/reveille?sslmode=require",
			"postgres://postgres:xxxxx@db.example.com:5432/reveille?sslmode=require"},
		{"a password in the query", "postgresql://app@db/reveille?sslmode=verify-full&password=SECRETPW&sslpassword=SECRETPW",
			"postgresql://app@db/reveille?sslmode=verify-full&password=xxxxx&sslpassword=xxxxx"},
		{"an escaped parameter name", "postgres://app@db/reveille?pass%77ord=SECRETPW", "postgres://app@db/reveille?pass%77ord=xxxxx"},
		{"a key=value connection string", "host=db user=app password=SECRETPW dbname=reveille", "host=db user=app password=xxxxx dbname=reveille"},
		{"a quoted key=value password", `host=db password='SECRET PW\' x' dbname=reveille`, "host=db password=xxxxx dbname=reveille"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, redactedDatabaseURL(tc.url))

			out := captureStdout(t, func() error {
				printDevInfo(settings{Addr: ":8080", DatabaseURL: tc.url, TemporalAddr: "127.0.0.1:7233"}, "(REVEILLE_JWT_SECRET)", "tok")
				return nil
			})

			require.Contains(t, out, "DATABASE_URL="+tc.want+"\n")
			require.NotContains(t, out, "SECRET PW")
			require.NotContains(t, out, "SECRETPW")
		})
	}
}
