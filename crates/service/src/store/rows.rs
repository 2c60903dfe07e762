//! An audit line as a row of `airlock_audit`: what it is indexed by, and its insertion, which
//! no line can stop.

use tokio_postgres::Client;

use super::db::db_error;

/// Rows per insert.
pub(super) const BATCH: usize = 500;

/// One audit line, with what its row is indexed by.
#[derive(Clone, Debug)]
pub(super) struct Row {
    /// Its number in this run (what an answer waiting for its record waits for).
    pub(super) n: u64,
    /// Its `line_key`, `<run>:<n>`, which makes sending it again harmless; None for the
    /// `audit_resumed` row (NULLs never conflict).
    pub(super) key: Option<String>,
    pub(super) event: String,
    pub(super) execution_id: Option<String>,
    pub(super) session_id: Option<String>,
    pub(super) key_fingerprint: Option<String>,
    pub(super) line: String,
    /// Written to the spool and synced.
    pub(super) spooled: bool,
}

impl Row {
    pub(super) fn of(n: u64, key: Option<String>, line: Vec<u8>) -> std::io::Result<Row> {
        let mut line = String::from_utf8(line).map_err(std::io::Error::other)?;
        line.truncate(line.trim_end().len());
        let mut value: serde_json::Value = serde_json::from_str(&line)?;
        // jsonb refuses NUL in a string, and a sandbox chooses some strings (a tool's name):
        // U+FFFD stands for it, as nothing else may make a line unstorable.
        if line.contains("\\u0000") {
            replace_nul(&mut value);
            line = value.to_string();
        }
        let text = |name: &str| value.get(name).and_then(|v| v.as_str()).map(str::to_owned);
        let event = text("event").unwrap_or_else(|| "record".to_owned());
        let (execution_id, session_id) = match event.as_str() {
            "record" | "started" => (text("id"), None),
            e if e.starts_with("session_") => (None, text("id")),
            // An egress connection names its execution, its session, or both.
            _ => (text("execution_id"), text("session_id")),
        };
        Ok(Row {
            n,
            key,
            key_fingerprint: text("key_fingerprint"),
            event,
            execution_id,
            session_id,
            line,
            spooled: false,
        })
    }
}

/// Every NUL in `value`'s strings and keys, replaced by U+FFFD.
fn replace_nul(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => *s = s.replace('\0', "\u{FFFD}"),
        Value::Array(items) => items.iter_mut().for_each(replace_nul),
        Value::Object(map) => {
            let entries = std::mem::take(map);
            for (k, mut v) in entries {
                replace_nul(&mut v);
                map.insert(k.replace('\0', "\u{FFFD}"), v);
            }
        }
        _ => {}
    }
}

/// Inserts rows in one statement and one transaction; a batch sent again after a lost
/// acknowledgement adds nothing (`line_key`). A row the database refuses as data (SQLSTATE
/// class 22, which NUL replacement should leave none of) is stored as an `audit_unstorable`
/// row holding its text, so that one line can never stop the writer.
pub(super) async fn insert(client: &Client, replica: &str, rows: &[&Row]) -> std::io::Result<()> {
    let refused_as_data =
        |e: &tokio_postgres::Error| e.code().is_some_and(|c| c.code().starts_with("22"));
    match insert_all(client, replica, rows).await {
        Err(e) if refused_as_data(&e) => {
            for row in rows {
                if let Err(e) = insert_all(client, replica, &[*row]).await {
                    if !refused_as_data(&e) {
                        return Err(db_error("writing audit lines", e));
                    }
                    let text = row.line.replace('\0', "\u{FFFD}");
                    let line = serde_json::json!({
                        "event": "audit_unstorable",
                        "error": db_error("storing a line", e).to_string(),
                        "text": text,
                    });
                    let stand_in = Row {
                        event: "audit_unstorable".into(),
                        line: line.to_string(),
                        ..Row::clone(row)
                    };
                    insert_all(client, replica, &[&stand_in])
                        .await
                        .map_err(|e| db_error("writing audit lines", e))?;
                }
            }
            Ok(())
        }
        other => other.map_err(|e| db_error("writing audit lines", e)),
    }
}

async fn insert_all(
    client: &Client,
    replica: &str,
    rows: &[&Row],
) -> Result<(), tokio_postgres::Error> {
    let mut columns: [Vec<Option<String>>; 6] = Default::default();
    for row in rows {
        columns[0].push(Some(row.event.clone()));
        columns[1].push(row.execution_id.clone());
        columns[2].push(row.session_id.clone());
        columns[3].push(row.key_fingerprint.clone());
        columns[4].push(Some(row.line.clone()));
        columns[5].push(row.key.clone());
    }
    let [event, execution, session, fingerprint, line, key] = &columns;
    client
        .execute(
            "INSERT INTO airlock_audit (replica, event, execution_id, session_id, key_fingerprint, line, line_key) \
             SELECT $1, e, x, s, k, l::jsonb, lk FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[]) \
             WITH ORDINALITY AS t(e, x, s, k, l, lk, o) ORDER BY o \
             ON CONFLICT (line_key) DO NOTHING",
            &[&replica, event, execution, session, fingerprint, line, key],
        )
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit_lines::line_of;

    #[test]
    fn nul_which_jsonb_refuses_becomes_a_replacement_character_keys_included() {
        let line = br#"{"event":"tool_call","execution_id":"ex_a","tool":"x\u0000y","args":{"k\u0000":["\u0000"]}}"#;
        let row = Row::of(7, None, line.to_vec()).unwrap();
        assert!(!row.line.contains("\\u0000"), "{}", row.line);
        let value: serde_json::Value = serde_json::from_str(&row.line).unwrap();
        assert_eq!(value["tool"], "x\u{FFFD}y");
        assert_eq!(value["args"]["k\u{FFFD}"][0], "\u{FFFD}");
        assert_eq!(
            (row.n, row.event.as_str(), row.execution_id.as_deref()),
            (7, "tool_call", Some("ex_a"))
        );
        // A backslash before "u0000" is text, not NUL: left as it is.
        let text = br#"{"event":"tool_call","tool":"a\\u0000"}"#;
        let row = Row::of(8, None, text.to_vec()).unwrap();
        let value: serde_json::Value = serde_json::from_str(&row.line).unwrap();
        assert_eq!(value["tool"], "a\\u0000");
    }

    #[test]
    fn an_egress_line_is_indexed_by_its_execution_and_its_session() {
        let record = |execution: Option<&str>, session: Option<&str>| {
            let record = airlock_egress::ConnectionRecord {
                event: "egress",
                execution_id: execution.map(str::to_owned),
                session_id: session.map(str::to_owned),
                between_cells: execution.is_none(),
                key: "k".into(),
                method: "GET".into(),
                host: "example.com".into(),
                port: 80,
                address: None,
                outcome: "allowed",
                reason: None,
                detail: None,
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
                credential: None,
                requests: None,
            };
            // The line as the file holds it, then as a row.
            Row::of(1, None, line_of(&record).unwrap()).unwrap()
        };
        let between = record(None, Some("se_a"));
        assert_eq!(
            (
                between.execution_id.as_deref(),
                between.session_id.as_deref()
            ),
            (None, Some("se_a"))
        );
        let line: serde_json::Value = serde_json::from_str(&between.line).unwrap();
        assert_eq!(line["between_cells"], true);
        let cell = record(Some("ex_b"), Some("se_a"));
        assert_eq!(
            (cell.execution_id.as_deref(), cell.session_id.as_deref()),
            (Some("ex_b"), Some("se_a"))
        );
        let line: serde_json::Value = serde_json::from_str(&cell.line).unwrap();
        assert!(line.get("between_cells").is_none(), "{line}");
        let execution = record(Some("ex_c"), None);
        assert_eq!(
            (
                execution.execution_id.as_deref(),
                execution.session_id.as_deref()
            ),
            (Some("ex_c"), None)
        );
    }
}
