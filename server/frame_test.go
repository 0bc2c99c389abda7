package server

import (
	"net/http"
	"testing"
)

// The web page acts with the browser's client certificate: another site
// must not frame it and trick a click on Revoke.
func TestWebPageRefusesToBeFramed(t *testing.T) {
	ts := startServer(t, t.TempDir(), testLimits())
	resp, err := http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	for header, want := range map[string]string{
		"Content-Security-Policy": "frame-ancestors 'none'",
		"X-Frame-Options":         "DENY",
	} {
		if got := resp.Header.Get(header); got != want {
			t.Errorf("GET / %s: got = %q, expected: %q", header, got, want)
		}
	}
}
