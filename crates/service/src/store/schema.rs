//! The tables: made or migrated at start, and what this replica left open repaired.

use std::collections::HashMap;

use tokio_postgres::Client;

use super::db::db_error;
use crate::audit_lines::{interrupted, line_of, Recovery, StartedLine};

/// Sessions lost at a restart are answered 410 for this long after they were opened.
const LOST_SESSIONS_DAYS: i32 = 7;

/// The schema, one step per version; a step never changes once released. Applied in order,
/// each in the transaction that records it in `airlock_migrations`.
const MIGRATIONS: &[&str] = &["
    CREATE TABLE airlock_audit (
        seq bigserial PRIMARY KEY,
        replica text NOT NULL,
        written_at timestamptz NOT NULL DEFAULT now(),
        event text NOT NULL,
        execution_id text,
        session_id text,
        key_fingerprint text,
        line jsonb NOT NULL,
        -- The run that wrote it and its number there: a batch sent again after its commit's
        -- acknowledgement was lost is not stored twice.
        line_key text UNIQUE
    );
    CREATE INDEX airlock_audit_execution ON airlock_audit (execution_id, event)
        WHERE execution_id IS NOT NULL;
    CREATE INDEX airlock_audit_session ON airlock_audit (session_id, event)
        WHERE session_id IS NOT NULL;
    CREATE INDEX airlock_audit_replica ON airlock_audit (replica, event);
"];

/// Makes or migrates the tables, once even when several replicas start together.
pub(super) async fn migrate(client: &mut Client) -> std::io::Result<()> {
    let err = |e| db_error("migrating", e);
    let tx = client.transaction().await.map_err(err)?;
    tx.batch_execute(
        "SET LOCAL client_min_messages = warning;
         SELECT pg_advisory_xact_lock(hashtext('airlock-migrations'));
         CREATE TABLE IF NOT EXISTS airlock_migrations (
             version integer PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT now()
         );",
    )
    .await
    .map_err(err)?;
    let applied: i32 = tx
        .query_one(
            "SELECT coalesce(max(version), 0) FROM airlock_migrations",
            &[],
        )
        .await
        .map_err(err)?
        .get(0);
    let known = MIGRATIONS.len() as i32;
    if applied > known {
        return Err(std::io::Error::other(format!(
            "the database's airlock tables are at version {applied}, made by a newer airlock; \
             this one knows up to {known}"
        )));
    }
    for (version, step) in (1..).zip(MIGRATIONS).skip(applied as usize) {
        tx.batch_execute(step)
            .await
            .map_err(|e| db_error(&format!("migration {version}"), e))?;
        tx.execute(
            "INSERT INTO airlock_migrations (version) VALUES ($1)",
            &[&version],
        )
        .await
        .map_err(err)?;
        tracing::info!(version, "PostgreSQL store migrated");
    }
    tx.commit().await.map_err(err)
}

/// This replica's executions that started and never ended get their `interrupted` record;
/// its sessions opened and never closed are lost (id to key fingerprint).
pub(super) async fn recover(
    client: &mut Client,
    replica: &str,
) -> std::io::Result<(Recovery, HashMap<String, String>)> {
    let err = |e| db_error("repairing this replica's rows", e);
    let tx = client.transaction().await.map_err(err)?;
    // Two servers given one name would otherwise both repair it.
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtext('airlock-replica:' || $1))",
        &[&replica],
    )
    .await
    .map_err(err)?;
    let open = tx
        .query(
            "SELECT s.line::text FROM airlock_audit s WHERE s.replica = $1 AND s.event = 'started' \
             AND NOT EXISTS (SELECT 1 FROM airlock_audit r WHERE r.execution_id = s.execution_id \
             AND r.event IN ('record', 'not_run')) ORDER BY s.seq",
            &[&replica],
        )
        .await
        .map_err(err)?;
    let mut recovery = Recovery::default();
    for row in open {
        let Ok(started) = serde_json::from_str::<StartedLine<'_>>(row.get::<_, &str>(0)) else {
            continue;
        };
        let record = interrupted(started);
        let line = String::from_utf8(line_of(&record)?).map_err(std::io::Error::other)?;
        tx.execute(
            "INSERT INTO airlock_audit (replica, event, execution_id, key_fingerprint, line) \
             VALUES ($1, 'record', $2, $3, $4::text::jsonb)",
            &[
                &replica,
                &record.id,
                &record.key_fingerprint,
                &line.trim_end(),
            ],
        )
        .await
        .map_err(err)?;
        recovery.interrupted.push(record.id);
    }
    let sessions = tx
        .query(
            "SELECT o.session_id, o.key_fingerprint FROM airlock_audit o WHERE o.replica = $1 \
             AND o.event = 'session_opened' AND o.written_at > now() - make_interval(days => $2) \
             AND NOT EXISTS (SELECT 1 FROM airlock_audit c \
             WHERE c.session_id = o.session_id AND c.event = 'session_closed')",
            &[&replica, &LOST_SESSIONS_DAYS],
        )
        .await
        .map_err(err)?;
    let lost: HashMap<String, String> = sessions
        .iter()
        .filter_map(|r| {
            Some((
                r.get::<_, Option<String>>(0)?,
                r.get::<_, Option<String>>(1)?,
            ))
        })
        .collect();
    recovery.lost_sessions = lost.len();
    tx.commit().await.map_err(err)?;
    Ok((recovery, lost))
}
