//! `GET /openapi.json`: OpenAPI 3.1, whose schemas are generated from the request and response
//! types themselves (JSON Schema 2020-12, as OpenAPI 3.1 uses).

use airlock_api::{ErrorBody, ExecuteRequest, ExecuteResponse, ExecutionRecord};
use schemars::generate::SchemaSettings;
use serde_json::{json, Value};

/// Every route, as `METHOD path`; the README's API section is checked against this list.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/execute"),
    ("GET", "/v1/executions/{id}"),
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

fn errors(codes: &[u16]) -> Value {
    let mut out = serde_json::Map::new();
    for code in codes {
        let description = match code {
            400 => "Malformed JSON, an unknown field, a wrong type, an invalid value, or a limit above the key's ceiling; `field` names it.",
            401 => "No key, or not a valid one (`WWW-Authenticate: Bearer`).",
            403 => "The key lacks the scope, or the request came from a foreign origin.",
            404 => "No such resource (or not this key's).",
            408 => "The body did not arrive in time.",
            413 => "The body, the code, stdin or the files are too large.",
            415 => "The body is not `application/json`.",
            421 => "The Host header is not one this server answers for.",
            429 => "The key's rate limit, or its concurrency and queue, is exhausted (`Retry-After`).",
            503 => "Every slot and the queue are full, or the server is shutting down (`Retry-After`).",
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

pub fn openapi() -> Value {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = "/components/schemas".into();
    settings.meta_schema = None;
    let mut generator = settings.into_generator();
    let request = generator.subschema_for::<ExecuteRequest>();
    let response = generator.subschema_for::<ExecuteResponse>();
    let record = generator.subschema_for::<ExecutionRecord>();
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
            "/v1/execute": {"post": {
                "summary": "Run code in a fresh sandbox",
                "requestBody": {"required": true, "content": json_body(&request)},
                "responses": with(errors(&[400, 401, 403, 408, 413, 415, 421, 429, 503]), "200",
                    json!({"description": "The execution's result, whatever its status. With `Accept: text/event-stream`, server-sent events instead: `stdout` and `stderr` (`{\"text\"}`) as the program writes, `truncated` (`{\"stream\", \"limit\"}`) at the output limit, then `result` (this object) or `error` (an error body).",
                           "content": with(json_body(&response), "text/event-stream", json!({"schema": {"type": "string"}}))})),
            }},
            "/v1/executions/{id}": {"get": {
                "summary": "The audit record of one of this key's executions",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": with(errors(&[401, 403, 404, 421]), "200",
                    json!({"description": "The record.", "content": json_body(&record)})),
            }},
            "/healthz": {"get": {
                "summary": "Liveness; needs no key",
                "security": [],
                "responses": {"200": {"description": "The process is up.",
                    "content": {"application/json": {"schema": {"type": "object", "properties": {"status": {"const": "ok"}}}}}}},
            }},
            "/readyz": {"get": {
                "summary": "Whether an execution could start now",
                "responses": with(with(errors(&[401, 421]), "200", json!({"description": "Ready."})), "503",
                    json!({"description": "Not ready; `reasons` says why.",
                           "content": {"application/json": {"schema": {"type": "object", "properties": {
                               "ready": {"type": "boolean"}, "reasons": {"type": "array", "items": {"type": "string"}}}}}}})),
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics (a key with the metrics scope, unless configured open)",
                "responses": with(errors(&[401, 403, 421]), "200",
                    json!({"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}})),
            }},
            "/openapi.json": {"get": {
                "summary": "This document",
                "responses": with(errors(&[401, 421]), "200", json!({"description": "OpenAPI 3.1."})),
            }},
        },
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_is_described_and_every_reference_resolves() {
        let doc = openapi();
        for (method, path) in ROUTES {
            assert!(
                doc["paths"][path][method.to_lowercase()].is_object(),
                "{method} {path}"
            );
        }
        assert_eq!(doc["paths"].as_object().unwrap().len(), ROUTES.len());
        let text = doc.to_string();
        for piece in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = piece.split('"').next().unwrap();
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "dangling $ref to {name}"
            );
        }
        let req = &doc["components"]["schemas"]["ExecuteRequest"];
        assert_eq!(req["required"], json!(["code"]));
        assert_eq!(
            req["additionalProperties"],
            json!(false),
            "unknown fields are refused"
        );
    }
}
