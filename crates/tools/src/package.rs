//! The `tools` package one execution sees, as data for the runner (which builds the modules
//! and functions from it), and the same API as Python signatures for a model to read
//! (`GET /v1/tools`, MCP `list_tool_apis`). Everything the runner turns into source text is an
//! identifier made here or one of a closed set of annotations; docs are set as data.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde_json::{json, Value};

use crate::config::is_identifier;
use crate::source::ToolInfo;

/// One tool a key may call, with the name its function has in the sandbox.
#[derive(Clone, Debug)]
pub struct Granted {
    pub server: String,
    pub tool: Arc<ToolInfo>,
    pub function: String,
}

/// Gives each tool of one server a distinct function name: its name where that is an
/// identifier, else with every other character made `_` (and `_` added after a keyword, a
/// leading digit or a clash).
pub(crate) fn function_names(tools: &[Arc<ToolInfo>]) -> Vec<String> {
    let mut taken = BTreeSet::new();
    tools
        .iter()
        .map(|t| {
            let mut name: String = t
                .name
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
                name.insert(0, '_');
            }
            // Dunder names are Python's own (`__getattr__` would replace the module's).
            while name.starts_with("__") {
                name.remove(0);
            }
            while !is_identifier(&name) || !taken.insert(name.clone()) {
                name.push('_');
            }
            name
        })
        .collect()
}

struct Param {
    py: String,
    key: String,
    annotation: Option<String>,
    required: bool,
    default: Option<Value>,
    description: Option<String>,
}

/// The keyword parameters of a tool, from its input schema's properties; `true` when some
/// property's name is not an identifier, so the function also takes `**arguments`.
fn params(schema: &Value) -> (Vec<Param>, bool) {
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    let mut more = false;
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return (out, false);
    };
    for (key, prop) in props {
        if !is_identifier(key) || key == "arguments" || key.starts_with("_airlock") {
            more = true;
            continue;
        }
        out.push(Param {
            py: key.clone(),
            key: key.clone(),
            annotation: annotation(prop),
            required: required.contains(key.as_str()),
            default: prop.get("default").cloned(),
            description: prop
                .get("description")
                .and_then(Value::as_str)
                .map(str::to_owned),
        });
    }
    (out, more)
}

/// A Python annotation for a property's schema, from a closed set of names; None when its
/// type is not simply one or more JSON types.
fn annotation(schema: &Value) -> Option<String> {
    fn collect(s: &Value, out: &mut Vec<&'static str>) -> bool {
        let name = |t: &str| match t {
            "string" => Some("str"),
            "integer" => Some("int"),
            "number" => Some("float"),
            "boolean" => Some("bool"),
            "array" => Some("list"),
            "object" => Some("dict"),
            "null" => Some("None"),
            _ => None,
        };
        match (s.get("type"), s.get("anyOf").or_else(|| s.get("oneOf"))) {
            (Some(Value::String(t)), _) => name(t).map(|n| out.push(n)).is_some(),
            (Some(Value::Array(ts)), _) => ts
                .iter()
                .all(|t| t.as_str().and_then(name).map(|n| out.push(n)).is_some()),
            (None, Some(Value::Array(alts))) => alts.iter().all(|a| collect(a, out)),
            _ => false,
        }
    }
    let mut names = Vec::new();
    if !collect(schema, &mut names) || names.is_empty() {
        return None;
    }
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(*n));
    Some(names.join(" | "))
}

fn summary(description: &str) -> String {
    let line = description.trim().lines().next().unwrap_or("").trim();
    if line.chars().count() > 120 {
        let cut: String = line.chars().take(117).collect();
        format!("{cut}...")
    } else {
        line.to_owned()
    }
}

/// A JSON value as a Python literal.
fn py_literal(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        // JSON's strings and numbers are valid Python literals as serde_json writes them.
        Value::Number(_) | Value::String(_) => v.to_string(),
        Value::Array(items) => {
            let items: Vec<String> = items.iter().map(py_literal).collect();
            format!("[{}]", items.join(", "))
        }
        Value::Object(map) => {
            let items: Vec<String> = map
                .iter()
                .map(|(k, v)| format!("{}: {}", Value::from(k.as_str()), py_literal(v)))
                .collect();
            format!("{{{}}}", items.join(", "))
        }
    }
}

fn doc(g: &Granted, params: &[Param], more: bool) -> String {
    let mut doc = g.tool.description.trim().to_owned();
    if !params.is_empty() || more {
        doc.push_str("\n\nArguments:");
        for p in params {
            let how = if p.required {
                "required".to_owned()
            } else {
                match &p.default {
                    Some(d) => format!("default {}", py_literal(d)),
                    None => "optional".to_owned(),
                }
            };
            let kind = p.annotation.as_deref().unwrap_or("any");
            doc.push_str(&format!("\n  {} ({kind}, {how})", p.py));
            if let Some(d) = &p.description {
                doc.push_str(": ");
                doc.push_str(d.trim());
            }
        }
        if more {
            doc.push_str("\n  **arguments: properties whose names are not Python identifiers");
        }
    }
    doc.push_str(&format!(
        "\n\nCalls `{}` on the `{}` server{}. Returns its structured result, or its text \
         (parsed when it is JSON), or bytes for an image; raises tools.ToolError.",
        g.tool.name,
        g.server,
        if g.tool.read_only {
            " (read-only)"
        } else {
            " (may write; granted by name)"
        }
    ));
    doc
}

/// The package for the runner: servers, their functions and each function's parameters.
pub(crate) fn package(granted: &[Granted], max_argument_bytes: u64) -> Value {
    let mut servers: Vec<Value> = Vec::new();
    let mut current: Option<(&str, Vec<Value>)> = None;
    let flush = |current: &mut Option<(&str, Vec<Value>)>, servers: &mut Vec<Value>| {
        if let Some((name, functions)) = current.take() {
            servers.push(json!({
                "name": name,
                "doc": format!("Tools of the `{name}` server that this execution may call."),
                "functions": functions,
            }));
        }
    };
    for g in granted {
        if current.as_ref().is_none_or(|(s, _)| *s != g.server) {
            flush(&mut current, &mut servers);
            current = Some((&g.server, Vec::new()));
        }
        let (params, more) = params(&g.tool.input_schema);
        let spec = json!({
            "function": g.function,
            "tool": g.tool.name,
            "doc": doc(g, &params, more),
            "summary": summary(&g.tool.description),
            "params": params.iter().map(|p| json!([
                p.py, p.key, p.annotation, p.required,
                if p.required { Value::Null } else { p.default.clone().map_or(Value::Null, |d| json!([d])) },
            ])).collect::<Vec<_>>(),
            "more": more,
        });
        if let Some((_, functions)) = current.as_mut() {
            functions.push(spec);
        }
    }
    flush(&mut current, &mut servers);
    json!({
        "doc": "The operator's tools this execution may call: one module per server, one \
                function per tool. tools.search(\"words\") finds them; a failed call raises \
                tools.ToolError. Each function also has an awaitable form: \
                await tools.server.function.aio(...).",
        "servers": servers,
        "max_argument_bytes": max_argument_bytes,
    })
}

/// One tool's API, for a model to read before it writes code (`GET /v1/tools`).
pub use airlock_api::ToolApi;

pub(crate) fn api(g: &Granted) -> ToolApi {
    let (params, more) = params(&g.tool.input_schema);
    let mut parts: Vec<String> = params
        .iter()
        .map(|p| {
            let mut s = p.py.clone();
            if let Some(a) = &p.annotation {
                s = format!("{s}: {a}");
            }
            if !p.required {
                s.push_str(" = ");
                s.push_str(&p.default.as_ref().map_or("...".into(), py_literal));
            }
            s
        })
        .collect();
    if !parts.is_empty() {
        parts.insert(0, "*".into());
    }
    if more {
        parts.push("**arguments".into());
    }
    ToolApi {
        name: format!("{}.{}", g.server, g.function),
        tool: g.tool.name.clone(),
        read_only: g.tool.read_only,
        signature: format!("def {}({})", g.function, parts.join(", ")),
        description: doc(g, &params, more),
        input_schema: g.tool.input_schema.clone(),
    }
}

/// The APIs as Python text: one stub per tool, grouped by module.
pub fn python_stubs(apis: &[ToolApi]) -> String {
    let mut out = String::from("import tools  # tools.search(\"words\") finds tools by name\n");
    let mut module = "";
    for api in apis {
        let (server, _) = api.name.split_once('.').unwrap_or((&api.name, ""));
        if server != module {
            module = server;
            out.push_str(&format!("\n# tools.{server}\n"));
        }
        let doc = api
            .description
            .replace("\\", "\\\\")
            .replace("\"\"\"", "\\\"\\\"\\\"");
        out.push_str(&format!(
            "{}:\n    \"\"\"{}\"\"\"\n\n",
            api.signature,
            doc.replace('\n', "\n    ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, schema: Value) -> Arc<ToolInfo> {
        Arc::new(ToolInfo {
            name: name.into(),
            description: "Finds things.\nMore text.".into(),
            validator: crate::source::input_validator(&schema).unwrap(),
            input_schema: schema,
            read_only: true,
            wraps_result: false,
        })
    }

    #[test]
    fn names_become_distinct_identifiers() {
        let tools: Vec<_> = [
            "find", "get-user", "get_user", "class", "9lives", "__init__", "",
        ]
        .iter()
        .map(|n| tool(n, json!({"type": "object"})))
        .collect();
        assert_eq!(
            function_names(&tools),
            [
                "find",
                "get_user",
                "get_user_",
                "class_",
                "_9lives",
                "_init__",
                "_"
            ]
        );
    }

    #[test]
    fn signatures_follow_the_schema() {
        let schema = json!({
            "type": "object",
            "properties": {
                "id": {"type": "integer", "description": "The id."},
                "tags": {"anyOf": [{"type": "array"}, {"type": "null"}], "default": null},
                "mode": {"type": "string", "default": "fast \"quoted\""},
                "odd-name": {"type": "string"},
                "from": {"type": "string"},
                "x": {"$ref": "#/$defs/x"}
            },
            "$defs": {"x": {"type": "string"}},
            "required": ["id"]
        });
        let g = Granted {
            server: "crm".into(),
            function: "find".into(),
            tool: tool("find", schema),
        };
        let api = api(&g);
        assert_eq!(
            api.signature,
            r#"def find(*, id: int, tags: list | None = None, mode: str = "fast \"quoted\"", x = ..., **arguments)"#
        );
        assert!(api.description.contains("id (int, required): The id."));
        let p = package(std::slice::from_ref(&g), 100);
        let f = &p["servers"][0]["functions"][0];
        assert_eq!(f["summary"], "Finds things.");
        assert_eq!(f["params"][0], json!(["id", "id", "int", true, null]));
        assert_eq!(
            f["params"][1],
            json!(["tags", "tags", "list | None", false, [null]])
        );
        assert_eq!(f["params"][3], json!(["x", "x", null, false, null]));
        assert_eq!(f["more"], true);
    }

    #[test]
    fn literals() {
        let v = json!({"a": [true, null, 1.5, "é\n"], "b": {}});
        assert_eq!(
            py_literal(&v),
            r#"{"a": [True, None, 1.5, "é\n"], "b": {}}"#
        );
    }
}
