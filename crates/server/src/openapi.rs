//! `GET /openapi.json`: OpenAPI 3.1, whose schemas are generated from the request and response
//! types themselves (JSON Schema 2020-12, as OpenAPI 3.1 uses). Each operation's id, tag and
//! security come from the route table (`http/routes.rs`), which lists every route once.

use airlock_api::{
    CellRequest, CellResponse, ErrorBody, EvalRequest, EvalResponse, ExecuteRequest,
    ExecuteResponse, ExecutionRecord, FileList, SessionInfo, SessionList, SessionRequest,
    ToolsResponse,
};
use schemars::generate::SchemaSettings;
use serde_json::{json, Value};

/// What `POST /v1/pickle/scan` answers: one pickle's report, or an archive's with one per
/// member (`airlock_pickle`'s `to_json`).
fn pickle_report_schema() -> Value {
    let count = json!({"type": "integer", "minimum": 0});
    let verdict = json!({
        "verdict": {"enum": ["safe", "unsafe", "malformed"]},
        "reasons": {"type": "array", "items": {"type": "string"}, "description": "Why `unsafe`."},
        "offset": {"type": "integer", "minimum": 0, "description": "Where `malformed` was found."},
        "reason": {"type": "string", "description": "Why `malformed`."},
    });
    let mut pickle = json!({"type": "object", "required": ["verdict"], "properties": {
        "protocol": {"type": ["integer", "null"]},
        "size": count, "pickles": count, "trailing_bytes": count, "opcodes": count,
        "globals": {"type": "array", "items": {"type": "object", "required": ["module", "name", "offset", "allowed"], "properties": {
            "module": {"type": "string"}, "name": {"type": "string"},
            "written": {"type": ["string", "null"], "description": "The name as written, when it differs (an alias resolved)."},
            "offset": count, "allowed": {"type": "boolean"}}}},
        "globals_omitted": count,
        "calls": {"type": "array", "items": {"type": "object", "required": ["opcode", "offset"], "properties": {
            "opcode": {"type": "string"}, "offset": count, "target": {"type": ["string", "null"]}}}},
        "calls_omitted": count,
    }});
    let mut file = json!({"type": "object", "required": ["kind", "verdict"], "properties": {
        "kind": {"enum": ["pickle", "zip", "tar"]},
        "members": {"type": "array", "description": "An archive's members, in order.", "items": {"type": "object", "required": ["name", "offset", "size"], "properties": {
            "name": {"type": "string"}, "offset": count, "size": count,
            "pickle": {"oneOf": [pickle.clone(), {"type": "null"}]},
            "error": {"type": "string"}}}},
    }});
    for schema in [&mut pickle, &mut file] {
        for (k, v) in verdict.as_object().into_iter().flatten() {
            schema["properties"][k] = v.clone();
        }
    }
    // A single pickle's report has the pickle's fields too.
    for (k, v) in pickle["properties"]
        .as_object()
        .cloned()
        .into_iter()
        .flatten()
    {
        file["properties"][k] = v;
    }
    file
}

fn errors(codes: &[u16]) -> Value {
    let mut out = serde_json::Map::new();
    for code in codes {
        let description = match code {
            400 => "Malformed JSON, an unknown field, a wrong type, an invalid value, or a limit above the key's ceiling; `field` names it.",
            401 => "No key (`WWW-Authenticate: Bearer`), or not a valid one (`error=\"invalid_token\"`).",
            403 => "The key lacks the scope, or the request came from a foreign origin.",
            404 => "No such resource (or not this key's).",
            408 => "The body did not arrive in time.",
            410 => "`session_lost`: the key's session was open when the server stopped; a session does not survive a restart.",
            413 => "The body, the code, stdin or the files are too large.",
            415 => "The body is not `application/json`.",
            421 => "The Host header is not one this server answers for.",
            429 => "The key's rate limit, its concurrency and queue, or its share of memory for request bodies and answers not yet read (`http.max_buffered_bytes_per_key`) is exhausted (`Retry-After`).",
            503 => "Every slot and the queue are full, the memory for bodies and answers of all keys is taken, the audit log or the store cannot be written (or a record read from the store), a sandbox cannot start, or the server is shutting down; always with `Retry-After` (seconds).",
            _ => "Error.",
        };
        out.insert(
            code.to_string(),
            json!({"description": description,
                   "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}),
        );
    }
    Value::Object(out)
}

fn with(mut responses: Value, code: &str, body: Value) -> Value {
    responses[code] = body;
    responses
}

fn id_param() -> Value {
    json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}})
}

fn name_param() -> Value {
    json!({"name": "name", "in": "path", "required": true, "description": "1-64 letters, digits, `-`, `_`, `.`, starting with a letter or digit (else 400).", "schema": {"type": "string"}})
}

/// An environment as `/v1/environments` gives it.
fn environment_schema() -> Value {
    json!({"type": "object", "properties": {
        "name": {"type": "string"},
        "hash": {"type": "string", "description": "SHA-256 of the interpreter and the sorted requirements: where it is stored."},
        "requirements": {"type": "array", "items": {"type": "string"}},
        "python": {"type": "string"},
        "created_at": {"type": "string"},
        "size_bytes": {"type": "integer"},
        "packages": {"type": "array", "items": {"type": "string"}, "description": "`name==version` of what was installed."},
    }})
}

/// A volume as `/v1/volumes` gives it.
fn volume_schema(usage: bool) -> Value {
    let mut v = json!({"type": "object", "required": ["name", "size_bytes", "max_entries", "created_at"], "properties": {
        "name": {"type": "string"},
        "size_bytes": {"type": "integer", "description": "The most its files may hold, bounded while they are written; counted in full against the key's quota."},
        "max_entries": {"type": "integer", "description": "The most files, directories and links it may hold."},
        "created_at": {"type": "string"},
    }});
    if usage {
        v["properties"]["used_bytes"] = json!({"type": "integer"});
        v["properties"]["used_entries"] = json!({"type": "integer"});
    }
    v
}

fn volume_path_param() -> Value {
    json!({"name": "path", "in": "path", "required": true, "description": "Relative to the volume's root; may contain `/`; each part at most 255 bytes (else 400); no link is followed on the way.", "schema": {"type": "string"}})
}

/// A volume's listing, as `/v1/volumes/{name}/files` gives it.
fn volume_files_schema() -> Value {
    json!({"type": "object", "required": ["files", "truncated"], "properties": {
        "files": {"type": "array", "items": {"type": "object", "required": ["path", "type", "size"], "properties": {
            "path": {"type": "string"},
            "type": {"enum": ["file", "dir", "link", "other"]},
            "size": {"type": "integer"},
            "lossy": {"type": "boolean", "description": "A name on its path is not UTF-8 (shown with U+FFFD)."},
            "unreadable": {"type": "boolean", "description": "It could not be looked at, or (a directory) its entries could not be read: what it holds is not listed."},
        }}},
        "truncated": {"type": "boolean"},
    }})
}

fn path_param() -> Value {
    json!({"name": "path", "in": "path", "required": true, "description": "Relative to the working directory; may contain `/`.", "schema": {"type": "string"}})
}

/// A background execution as `/v1/executions` gives it (its result follows once it has one).
fn background_schema() -> Value {
    let time = json!({"type": "string", "description": "RFC 3339, UTC."});
    json!({"type": "object", "required": ["id", "background", "state", "submitted_at", "limits", "events"], "properties": {
        "id": {"type": "string"},
        "background": {"const": true},
        "state": {"enum": ["queued", "running", "finished", "failed", "cancelled", "interrupted"]},
        "submitted_at": time, "started_at": time, "ended_at": time,
        "limits": {"type": "object"},
        "events": {"type": "string", "description": "The path of its events."},
        "error": {"type": "object", "description": "Why it ended without a result (`failed`, `cancelled` before it ran, `interrupted`): `code`, `message`."},
        "result": {"type": "object", "description": "The result, output and all, once it ran."},
    }})
}

/// The document without each operation's id, tag and security, which the route table
/// (`http/routes.rs`) adds.
pub(crate) fn document() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let request = generator.subschema_for::<ExecuteRequest>();
    let response = generator.subschema_for::<ExecuteResponse>();
    let record = generator.subschema_for::<ExecutionRecord>();
    let session_request = generator.subschema_for::<SessionRequest>();
    let session = generator.subschema_for::<SessionInfo>();
    let sessions = generator.subschema_for::<SessionList>();
    let cell_request = generator.subschema_for::<CellRequest>();
    let cell_response = generator.subschema_for::<CellResponse>();
    let files = generator.subschema_for::<FileList>();
    let eval_request = generator.subschema_for::<EvalRequest>();
    let eval_response = generator.subschema_for::<EvalResponse>();
    let tools = generator.subschema_for::<ToolsResponse>();
    let approvals = generator.subschema_for::<airlock_api::ApprovalList>();
    let approval = generator.subschema_for::<airlock_api::ApprovalDetail>();
    let decision = generator.subschema_for::<airlock_api::DecisionRequest>();
    let decided = generator.subschema_for::<airlock_api::Decided>();
    generator.subschema_for::<ErrorBody>();
    let schemas = generator.definitions().clone();
    let json_body = |schema: &schemars::Schema| json!({"application/json": {"schema": schema}});

    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "airlock",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Runs untrusted code in a Linux sandbox and returns only data. A sandbox verdict (a timeout, a memory kill, a seccomp kill) is a 200 with its status.",
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/pickle/scan": {"post": {
                "summary": "Scan a pickle, or a ZIP archive of pickles, without running it",
                "requestBody": {"required": false, "description": "The bytes to scan; none is an empty (malformed) pickle.", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                "responses": with(errors(&[401, 403, 408, 413, 421, 429, 503]), "200",
                    json!({"description": "`kind` (`pickle`, `zip` or `tar`), `verdict` (`safe`, `unsafe` with `reasons`, `malformed` with `offset` and `reason`), the globals and call sites found (per member for an archive).",
                           "content": {"application/json": {"schema": pickle_report_schema()}}})),
            }},
            "/v1/tools": {"get": {
                "summary": "The operator's tools this key's code may call (code mode), with their Python signatures",
                "responses": with(errors(&[401, 403, 421, 429, 503]), "200",
                    json!({"description": "One entry per tool granted to the key whose server is up: `tools.<server>.<function>(...)` inside the sandbox, its signature, description and input schema; `python` has them all as stubs.",
                           "content": json_body(&tools)})),
            }},
            "/v1/approvals": {"get": {
                "summary": "Tool calls waiting for an approval that this key may decide (the calls of the keys its `approves` names, never its own); scope `approve`",
                "responses": with(errors(&[401, 403, 421, 429, 503]), "200",
                    json!({"description": "The waiting calls, oldest first: execution, key, tool, the arguments' preview (within `tools.approval_shown_bytes`, every key and every value but long strings, anything but printable ASCII written as `\\u{...}`), the arguments themselves when they are small and printable ASCII, the code's line, and when each times out.",
                           "content": json_body(&approvals)})),
            }},
            "/v1/approvals/{id}": {
                "get": {
                    "summary": "One waiting tool call that this key may decide, with its arguments whole; scope `approve`",
                    "parameters": [id_param()],
                    "responses": with(errors(&[401, 403, 404, 421, 429, 503]), "200",
                        json!({"description": "The call as `GET /v1/approvals` lists it (`approval`), and `arguments`: the JSON the call will send, byte for byte (its size and SHA-256 are the approval's). 404 for an id unknown, decided already, timed out, withdrawn (its execution ended) or not this key's to decide.",
                               "content": json_body(&approval)})),
                },
                "post": {
                    "summary": "Approve or deny one waiting tool call, once; scope `approve`",
                    "parameters": [id_param()],
                    "requestBody": {"required": true, "content": json_body(&decision)},
                    "responses": with(errors(&[400, 401, 403, 404, 408, 413, 415, 421, 429, 503]), "200",
                        json!({"description": "Decided: an approved call runs now, a denied one raises `ToolError(kind=\"denied\")` in the sandbox. 404 for an id unknown, decided already, timed out, withdrawn (its execution ended) or not this key's to decide.",
                               "content": json_body(&decided)})),
                },
            },
            "/v1/eval": {"post": {
                "summary": "Evaluate a Python literal expression natively (no sandbox, no interpreter)",
                "requestBody": {"required": true, "content": json_body(&eval_request)},
                "responses": with(errors(&[400, 401, 403, 408, 413, 415, 421, 429, 503]), "200",
                    json!({"description": "The value (`ok` true: `type`, `repr`, `str`, `value` when JSON holds it exactly) or the Python-style error (`ok` false: `error.type`, `error.message`, `error.limit` when a budget refused).",
                           "content": json_body(&eval_response)})),
            }},
            "/v1/execute": {"post": {
                "summary": "Run code in a fresh sandbox",
                "requestBody": {"required": true, "content": json_body(&request)},
                "responses": with(errors(&[400, 401, 403, 408, 413, 415, 421, 429, 503]), "200",
                    json!({"description": "The execution's result, whatever its status. With `Accept: text/event-stream`, server-sent events instead: `stdout` and `stderr` (`{\"text\"}`) as the program writes, `truncated` (`{\"stream\", \"limit\"}`) at the output limit, then `result` (this object, but for the output the events carried: `stdout` and `stderr` empty, `output_streamed` true) or `error` (an error body). The JSON answer has a `Content-Length`; its `stdout` and `stderr` are at most `output_bytes` bytes as written, up to 6 times that sent (a control character is `\\u00XX`, an invalid byte U+FFFD). A client that takes it more slowly than `http.answer_min_bytes_per_second` is cut off.",
                           "content": with(json_body(&response), "text/event-stream", json!({"schema": {"type": "string"}}))})),
            }},
            "/v1/executions": {"post": {
                "summary": "Submit code to run in the background: answered 202 at once, run to its end whether or not anyone listens",
                "requestBody": {"required": true, "content": json_body(&request)},
                "responses": with(errors(&[400, 401, 403, 408, 413, 415, 421, 429, 503]), "202",
                    json!({"description": "Taken: the execution's state (`queued`), with `Location: /v1/executions/{id}`. `limits.timeout_ms` and `limits.cpu_ms` may reach `background.max_timeout_ms` (default 4 h); left out, `timeout_ms` is `background.default_timeout_ms` and `cpu_ms` the execution's `timeout_ms`. 429 when the key already has `background.max_queued_per_key` waiting, keeps `background.max_kept_per_key`, or its background executions' events, results and waiting jobs would store more than `background.max_bytes_per_key`.",
                           "content": {"application/json": {"schema": background_schema()}}})),
            }},
            "/v1/executions/{id}": {
                "get": {
                    "summary": "One of this key's executions: a background execution's state and, once it has one, its result; any other execution's audit record",
                    "parameters": [id_param()],
                    "responses": with(errors(&[401, 403, 404, 421, 429, 503]), "200",
                        json!({"description": "A background execution (`background` true): `state` (`queued`, `running`, `finished`, `failed`, `cancelled`, `interrupted`), its times, and `result` (output and all, read from the disk) once it ran, or `error`. Any other execution: its audit record.",
                               "content": {"application/json": {"schema": {"oneOf": [background_schema(), record]}}}})),
                },
                "delete": {
                    "summary": "Delete a background execution: cancelled if it is queued or running, then removed (its result and events); read what you need first",
                    "parameters": [id_param()],
                    "responses": with(with(errors(&[401, 403, 404, 421, 429, 503]), "200",
                        json!({"description": "Removed: its last state (`cancelled` if it was queued or running). It is then 404.", "content": {"application/json": {"schema": background_schema()}}})), "202",
                        json!({"description": "Cancelled and still ending after 10 s: removed once it ends.", "content": {"application/json": {"schema": background_schema()}}})),
                },
            },
            "/v1/executions/{id}/events": {"get": {
                "summary": "A background execution's events as server-sent events, from its start or after the event `Last-Event-ID` names, followed while it runs",
                "parameters": [id_param(), {"name": "Last-Event-ID", "in": "header", "required": false, "description": "The `id` of the last event received: the stream resumes after it (each byte of output is sent once). 400 when it is not one of the execution's event ids.", "schema": {"type": "string"}}],
                "responses": with(errors(&[400, 401, 403, 404, 421, 429, 503]), "200",
                    json!({"description": "`stdout`, `stderr` (`{\"text\"}`), `truncated`, `approval_requested`, then `result` (the result without its output, `output_streamed` true) or `error`; each with an `id:`. The stream ends after the last event; while the execution is quiet a comment is sent every `http.sse_keep_alive_ms`.",
                           "content": {"text/event-stream": {"schema": {"type": "object", "required": ["id", "event", "data"], "properties": {
                               "id": {"type": "string", "description": "The byte offset just past this event in the execution's log: send it as `Last-Event-ID` to resume after it."},
                               "event": {"enum": ["stdout", "stderr", "truncated", "approval_requested", "result", "error"]},
                               "data": {"type": "string", "description": "One line of JSON."}}}}}})),
            }},
            "/v1/environments": {
                "get": {
                    "summary": "The named environments requests may use (`environment`)",
                    "responses": with(errors(&[401, 403, 421, 429, 503]), "200",
                        json!({"description": "Every environment.", "content": {"application/json": {"schema": {"type": "array", "items": environment_schema()}}}})),
                },
                "post": {
                    "summary": "Build an environment (pip, inside a sandbox whose only egress is the package index) and name it; answers when the build is done; scope `admin`",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {
                        "type": "object", "additionalProperties": false, "required": ["name", "requirements"],
                        "properties": {
                            "name": {"type": "string", "description": "1-64 letters, digits, `-`, `_`, `.`."},
                            "requirements": {"type": "array", "items": {"type": "string"}, "description": "Requirement specifiers (no options, URLs or paths)."},
                        }}}}},
                    "responses": with(with(with(errors(&[400, 401, 403, 413, 415, 421, 429, 503]), "409",
                        json!({"description": "A build of this name is running."})), "422",
                        json!({"description": "The build failed (`build_failed`); the message names its log."})), "201",
                        json!({"description": "The environment, `built` (false: an identical build was reused) and the log's last lines (`log_tail`).",
                               "content": {"application/json": {"schema": environment_schema()}}})),
                },
            },
            "/v1/environments/{name}": {
                "get": {
                    "summary": "One environment",
                    "parameters": [name_param()],
                    "responses": with(errors(&[400, 401, 403, 404, 421, 429, 503]), "200",
                        json!({"description": "The environment.", "content": {"application/json": {"schema": environment_schema()}}})),
                },
                "delete": {
                    "summary": "Remove an environment (its stored tree goes when no other name uses it); scope `admin`",
                    "parameters": [name_param()],
                    "responses": with(errors(&[400, 401, 403, 404, 409, 421, 503]), "204", json!({"description": "Removed."})),
                },
            },
            "/v1/sessions": {
                "post": {
                    "summary": "Start a session: one sandbox and interpreter for many cells, this key's alone",
                    "requestBody": {"required": true, "content": json_body(&session_request)},
                    "responses": with(errors(&[400, 401, 403, 413, 415, 421, 429, 503]), "201",
                        json!({"description": "The session.", "content": json_body(&session)})),
                },
                "get": {
                    "summary": "This key's sessions",
                    "responses": with(errors(&[401, 403, 421, 429, 503]), "200",
                        json!({"description": "Its sessions.", "content": json_body(&sessions)})),
                },
            },
            "/v1/sessions/{id}": {
                "get": {
                    "summary": "One of this key's sessions",
                    "parameters": [id_param()],
                    "responses": with(errors(&[401, 403, 404, 410, 421, 429, 503]), "200",
                        json!({"description": "The session.", "content": json_body(&session)})),
                },
                "delete": {
                    "summary": "Close a session: its sandbox is destroyed (a running cell with it) before the answer",
                    "parameters": [id_param()],
                    "responses": with(errors(&[401, 403, 404, 410, 421]), "204", json!({"description": "Closed."})),
                },
            },
            "/v1/sessions/{id}/execute": {"post": {
                "summary": "Run a cell in the session's interpreter (streams with Accept: text/event-stream, as /v1/execute)",
                "parameters": [id_param()],
                "requestBody": {"required": true, "content": json_body(&cell_request)},
                "responses": with(with(with(errors(&[400, 401, 403, 404, 410, 413, 415, 421, 429, 503]), "409",
                    json!({"description": "The session is running another request (`session_busy`) or has ended (`session_ended`)."})), "422",
                    json!({"description": "The session was paused and its snapshot is refused (`snapshot_invalid`)."})), "200",
                    json!({"description": "The cell's result; `session_ended` when it ended the session; `resumed` when it brought a paused session back first.",
                           "content": with(json_body(&cell_response), "text/event-stream", json!({"schema": {"type": "string"}}))})),
            }},
            "/v1/sessions/{id}/pause": {"post": {
                "summary": "Pause a session: its state (variables, functions, classes, imported modules, files under /work and /tmp, pip-installed packages) written to a snapshot by its own sandbox, then its sandbox freed; its next request brings it back in a fresh sandbox",
                "parameters": [id_param()],
                "responses": with(with(with(errors(&[401, 403, 404, 410, 413, 421, 429, 503]), "409",
                    json!({"description": "The session is running another request (`session_busy`) or has ended (`session_ended`)."})), "422",
                    json!({"description": "The sandbox could not write its snapshot (`snapshot_failed`)."})), "200",
                    json!({"description": "The session, paused: `paused` says what the snapshot holds and what it could not keep (413 `quota_exceeded`: the state is over what may be kept; nothing was, and the session runs on).",
                           "content": json_body(&session)})),
            }},
            "/v1/sessions/{id}/resume": {"post": {
                "summary": "Bring a paused session back in a fresh sandbox (its next cell does this too); an open one is answered as it is",
                "parameters": [id_param()],
                "responses": with(with(errors(&[401, 403, 404, 410, 413, 421, 429, 503]), "409",
                    json!({"description": "Another request is pausing, resuming or forking it (`session_busy`)."})), "200",
                    json!({"description": "The session, open: `resumed` says what came back and what could not (422 `snapshot_invalid`: the snapshot was altered or is not this session's, and nothing of it ran).",
                           "content": json_body(&session)})),
            }},
            "/v1/sessions/{id}/fork": {"post": {
                "summary": "A new session with the state of this one (open or paused), which goes on as it was",
                "parameters": [id_param()],
                "responses": with(with(errors(&[401, 403, 404, 410, 413, 421, 422, 429, 503]), "409",
                    json!({"description": "The session is busy (`session_busy`), or a volume it mounts writable would get a second writer (`volume_busy`)."})), "201",
                    json!({"description": "The new session, open: `resumed` says what it holds.", "content": json_body(&session)})),
            }},
            "/v1/sessions/{id}/files": {"get": {
                "summary": "Everything below the session's working directory (links are listed, never followed)",
                "parameters": [id_param()],
                "responses": with(with(errors(&[401, 403, 404, 410, 409, 413, 421, 429, 503]), "422",
                    json!({"description": "The session was paused and its snapshot is refused (`snapshot_invalid`)."})), "200",
                    json!({"description": "The entries (a paused session is brought back first).", "content": json_body(&files)})),
            }},
            "/v1/sessions/{id}/files/{path}": {
                "get": {
                    "summary": "A regular file below the working directory; no link is followed on the way",
                    "parameters": [id_param(), path_param()],
                    "responses": with(with(errors(&[400, 401, 403, 404, 410, 409, 413, 421, 429, 503]), "422",
                        json!({"description": "The session was paused and its snapshot is refused (`snapshot_invalid`)."})), "200",
                        json!({"description": "Its contents (a paused session is brought back first).", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
                },
                "put": {
                    "summary": "Write a file below the working directory (missing directories are made); a link in the way is refused",
                    "parameters": [id_param(), path_param()],
                    "requestBody": {"required": false, "description": "The file's contents; none makes an empty file.", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                    "responses": with(with(errors(&[400, 401, 403, 404, 410, 409, 413, 421, 429, 503]), "422",
                        json!({"description": "The session was paused and its snapshot is refused (`snapshot_invalid`)."})), "204", json!({"description": "Written (a paused session is brought back first)."})),
                },
            },
            "/v1/volumes": {
                "post": {
                    "summary": "Make a volume: a named directory of this key's, bounded in bytes and entries while it is written, kept across restarts",
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {
                        "type": "object", "additionalProperties": false, "required": ["name", "size_bytes"],
                        "properties": {
                            "name": {"type": "string", "description": "1-64 of `a-z`, `0-9`, `-`, `_`, `.`, starting with a letter or digit."},
                            "size_bytes": {"type": "integer", "description": "At least 8 MiB, at most `volumes.max_size_bytes` (else 400 naming it)."},
                            "max_entries": {"type": "integer", "description": "Default one per 16 KiB of its size, at least 1024; at most `volumes.max_entries` and one per 4 KiB of `size_bytes` (else 400 naming it)."},
                        }}}}},
                    "responses": with(with(with(errors(&[400, 401, 403, 413, 415, 421, 429, 503]), "409",
                        json!({"description": "A volume of this name exists."})), "422",
                        json!({"description": "Volumes are not available on this host (`volumes_unavailable`: not root, or no loop devices)."})), "201",
                        json!({"description": "The volume (413 `quota_exceeded` when it would pass the key's quota).", "content": {"application/json": {"schema": volume_schema(false)}}})),
                },
                "get": {
                    "summary": "This key's volumes",
                    "responses": with(errors(&[401, 403, 421, 429, 503]), "200",
                        json!({"description": "`volumes`: each of this key's volumes.", "content": {"application/json": {"schema": {"type": "object", "properties": {"volumes": {"type": "array", "items": volume_schema(false)}}}}}})),
                },
            },
            "/v1/volumes/{name}": {
                "get": {
                    "summary": "One of this key's volumes, with what it holds now",
                    "parameters": [name_param()],
                    "responses": with(errors(&[401, 403, 404, 409, 421, 429, 503]), "200",
                        json!({"description": "The volume, `used_bytes` and `used_entries`.", "content": {"application/json": {"schema": volume_schema(true)}}})),
                },
                "delete": {
                    "summary": "Delete a volume and everything in it; refused (409 `volume_in_use`, naming the holders) while an execution, a session or a file request holds it",
                    "parameters": [name_param()],
                    "responses": with(errors(&[401, 403, 404, 409, 421]), "204", json!({"description": "Deleted."})),
                },
            },
            "/v1/volumes/{name}/files": {"get": {
                "summary": "Every entry of the volume (links are listed, never followed)",
                "parameters": [name_param()],
                "responses": with(errors(&[401, 403, 404, 409, 421, 429, 503]), "200",
                    json!({"description": "`files`: `path`, `type` (`file`, `dir`, `link`, `other`) and `size` of each, however deep; `lossy` where a name on its path is not UTF-8 (shown with U+FFFD; the file routes cannot name it), `unreadable` where it could not be looked at or, a directory, its entries could not be read (what it holds is not listed). `truncated`: there were more than 10,000 entries or 4 MiB of paths.", "content": {"application/json": {"schema": volume_files_schema()}}})),
            }},
            "/v1/volumes/{name}/files/{path}": {
                "get": {
                    "summary": "A regular file of the volume; no link is followed on the way",
                    "parameters": [name_param(), volume_path_param()],
                    "responses": with(errors(&[400, 401, 403, 404, 409, 421, 429, 503]), "200",
                        json!({"description": "Its contents.", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}})),
                },
                "put": {
                    "summary": "Write a file of the volume (missing directories are made), as the volume's one writer; a link in the way is refused",
                    "parameters": [name_param(), volume_path_param()],
                    "requestBody": {"required": false, "description": "The file's contents; none makes an empty file.", "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}},
                    "responses": with(errors(&[400, 401, 403, 404, 409, 413, 421]), "204", json!({"description": "Written whole: a file that was there is replaced, keeping its permissions. Refused or failed (413 `volume_full` when the volume has no room for it beside the file it replaces; 400 for the path), nothing of it is left: the old file is as it was, and no directory is made."})),
                },
                "delete": {
                    "summary": "Remove a file, a link (never its target) or an empty directory of the volume",
                    "parameters": [name_param(), volume_path_param()],
                    "responses": with(errors(&[400, 401, 403, 404, 409, 421]), "204", json!({"description": "Removed."})),
                },
            },
            "/mcp": {"post": {
                "summary": "The Model Context Protocol over streamable HTTP: the tools of `airlock mcp` (run_python, eval_expression, sessions); scope `execute`",
                "description": "One JSON-RPC 2.0 message per POST, which must accept both `application/json` and `text/event-stream` (else 406), answered as JSON. Stateless: no `Mcp-Session-Id`, no GET stream. Tool verdicts and refusals are tool results with `isError`; unknown tools and bad arguments are JSON-RPC errors.",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"type": "object", "description": "A JSON-RPC 2.0 request or notification."}}}},
                "responses": with(with(with(errors(&[401, 403, 408, 413, 415, 421, 429, 503]), "200",
                    json!({"description": "The JSON-RPC answer.", "content": {"application/json": {"schema": {"type": "object"}}}})),
                    "202", json!({"description": "A notification, accepted; no body."})),
                    "406", json!({"description": "The request does not accept both `application/json` and `text/event-stream`."})),
            }},
            "/healthz": {"get": {
                "summary": "Liveness; needs no key",
                "responses": {"200": {"description": "The process is up.",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {"status": {"const": "ok"}}}}}}},
            }},
            "/readyz": {"get": {
                "summary": "Whether an execution could start now",
                "responses": with(with(errors(&[401, 421]), "200", json!({"description": "Ready."})), "503",
                    json!({"description": "Not ready; `reasons` says why, `Retry-After` when to ask again.",
                           "content": {"application/json": {"schema": {"type": "object", "properties": {
                               "ready": {"type": "boolean"}, "reasons": {"type": "array", "items": {"type": "string"}}}}}}})),
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics (a key with the metrics scope, unless configured open)",
                "responses": with(errors(&[401, 403, 421]), "200",
                    json!({"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}})),
            }},
            "/openapi.json": {"get": {
                "summary": "This document; needs no key",
                "responses": {"200": {"description": "OpenAPI 3.1.", "content": {"application/json": {"schema": {"type": "object"}}}}},
            }},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    })
}
