#!/usr/bin/env bash
# Code mode, end to end: starts airlock with two MCP tool servers, runs summary.py (which joins
# their results inside the sandbox) and prints the answer. Run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/../.."
. scripts/lib.sh
ensure_mcp_client
cargo build --release -q -p airlock
# The servers' credentials live in airlock's environment, never in its config or the sandbox.
export CRM_TOKEN=crm-secret-token BILLING_API_KEY=billing-secret-key
state=$(mktemp -d)
./target/release/airlock serve --config examples/code_mode/airlock.toml --state-dir "$state" &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -rf "$state"' EXIT
for _ in $(seq 100); do curl -sf http://127.0.0.1:8090/healthz >/dev/null && break; sleep 0.1; done
key=demo-key-0123456789abcdef
echo "== the tools this key's code may call"
curl -sf -H "Authorization: Bearer $key" http://127.0.0.1:8090/v1/tools | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["python"])'
echo "== summary.py, run in the sandbox"
/usr/bin/python3 -c 'import json; print(json.dumps({"code": open("examples/code_mode/summary.py").read()}))' |
  curl -sf -H "Authorization: Bearer $key" -H 'Content-Type: application/json' -d @- http://127.0.0.1:8090/v1/execute |
  /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); print(r["status"], "tool calls:", r["usage"]["tool_calls"]); print(json.dumps(r["result"], indent=2))'
