//! A result's value: the JSON schema of the forms airlock marks with `"$airlock"` (README
//! "What comes back"), and the value as text for a model to read.

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

/// The key that marks a form of a value JSON has no type for (README "What comes back").
pub const MARK: &str = "$airlock";

/// A result's value as text for a model to read: its JSON, but with an int past 64 bits and a
/// float that is not finite as Python prints them (`1180591620717411303424`, `nan`, `inf`,
/// `-inf`), not as their `{"$airlock": "int" | "float", "value": ...}` forms.
pub fn value_text(value: &serde_json::Value) -> String {
    let mut out = String::new();
    write_value_text(&mut out, value);
    out
}

fn write_value_text(out: &mut String, value: &serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value_text(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            if let (2, Some(Value::String(kind)), Some(Value::String(v))) =
                (map.len(), map.get(MARK), map.get("value"))
            {
                if kind == "int" || kind == "float" {
                    out.push_str(v);
                    return;
                }
            }
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                write_value_text(out, v);
            }
            out.push('}');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A value as an execution's `result` (or an evaluation's `value`) holds it: plain JSON, or one
/// of the forms marked `"$airlock"`, nested by the same rules. Only its JSON schema is of use:
/// the value itself is a `serde_json::Value`.
#[derive(Debug)]
pub struct ResultValue;

impl JsonSchema for ResultValue {
    fn schema_name() -> Cow<'static, str> {
        "ResultValue".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let value = generator.subschema_for::<ResultValue>();
        let number = json_schema!({"anyOf": [
            {"type": "number"},
            {"type": "object", "required": [MARK, "value"],
             "properties": {MARK: {"const": "float"}, "value": {"enum": ["nan", "inf", "-inf"]}}},
        ]});
        let values = json_schema!({"type": "array", "items": value});
        let form = |kind: &str, required: &[&str], properties: serde_json::Value| {
            let mut properties = properties;
            properties[MARK] = serde_json::json!({"const": kind});
            let mut required: Vec<&str> = required.to_vec();
            required.insert(0, MARK);
            serde_json::json!({"type": "object", "required": required, "properties": properties})
        };
        let forms = [
            form(
                "int",
                &["value"],
                serde_json::json!({"value": {
                "type": "string", "pattern": "^-?(0|[1-9][0-9]*)$", "maxLength": 4301,
                "description": "An int past 64 bits, in decimal: at most 4300 digits."}}),
            ),
            form(
                "float",
                &["value"],
                serde_json::json!({"value": {"enum": ["nan", "inf", "-inf"]}}),
            ),
            form(
                "bytes",
                &["base64"],
                serde_json::json!({"base64": {"type": "string"}}),
            ),
            form(
                "set",
                &["type", "items"],
                serde_json::json!({
                "type": {"enum": ["set", "frozenset"]}, "items": values}),
            ),
            form(
                "dict",
                &["items"],
                serde_json::json!({"items": {"type": "array", "items": {
                "type": "array", "prefixItems": [value, value], "minItems": 2, "maxItems": 2}}}),
            ),
            form(
                "datetime",
                &["type", "iso"],
                serde_json::json!({
                "type": {"type": "string"}, "iso": {"type": "string"}}),
            ),
            form(
                "timedelta",
                &["seconds"],
                serde_json::json!({"seconds": {"type": "number"}}),
            ),
            form(
                "decimal",
                &["value"],
                serde_json::json!({"value": {"type": "string"}}),
            ),
            form(
                "complex",
                &["real", "imag"],
                serde_json::json!({"real": number, "imag": number}),
            ),
            form(
                "ndarray",
                &["dtype", "shape", "data"],
                serde_json::json!({
                "dtype": {"type": "string"},
                "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                "data": value}),
            ),
            form(
                "dataframe",
                &["columns", "index", "records"],
                // `dtypes` (pandas' name of each column's dtype) is sent by every server since
                // it was added; a result stored before then has none.
                serde_json::json!({
                "columns": values, "index": values, "records": values,
                "dtypes": {"type": "array", "items": {"type": "string"}}}),
            ),
            form(
                "series",
                &["name", "index", "data"],
                serde_json::json!({
                "name": value, "index": values, "data": values}),
            ),
            form(
                "repr",
                &["type", "repr", "truncated", "why"],
                serde_json::json!({
                "type": {"type": "string"}, "repr": {"type": "string", "maxLength": 4096},
                "truncated": {"type": "boolean"}, "why": {"type": "string"}}),
            ),
        ];
        json_schema!({
            "description": "Plain JSON (tuples as arrays, dicts with string keys as objects), or \
                a form marked \"$airlock\" for a value JSON has no type for; items inside a form \
                follow the same rules. An object with a \"$airlock\" key is always a form.",
            "anyOf": [
                {"type": ["null", "boolean", "number", "string"]},
                values,
                {"type": "object", "not": {"required": [MARK]}, "additionalProperties": value},
                {"oneOf": forms},
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_s_text_shows_big_ints_and_non_finite_floats_as_python_prints_them() {
        let value = serde_json::json!([
            {"$airlock": "int", "value": "15511210043330985984000000"},
            {"$airlock": "float", "value": "nan"},
            {"x": {"$airlock": "float", "value": "-inf"}, "\"q": 1.5},
            {"$airlock": "dict", "items": [[1, {"$airlock": "int", "value": "-18446744073709551617"}]]},
            {"$airlock": "int", "value": "7", "more": true},
            null, true, "s"
        ]);
        assert_eq!(
            value_text(&value),
            r#"[15511210043330985984000000,nan,{"x":-inf,"\"q":1.5},{"$airlock":"dict","items":[[1,-18446744073709551617]]},{"$airlock":"int","value":"7","more":true},null,true,"s"]"#
        );
    }
}
