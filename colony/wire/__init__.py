"""What crosses the API, shared by its two sides: id patterns, the JSON input check, run statuses
and event kinds, the run request and answer models, and the bearer-token conventions. A leaf: it
imports only `config` and `errors`, so the HTTP client and the CLI never load the runtime."""
