//! The pickle scan service: a pickle or a ZIP archive of them, scanned without being run, a
//! bounded number at once (`[pickle]`).

use crate::body::{read_body_as, Body, ReadBody};
use crate::error::Error;
use crate::keys::Key;
use crate::services::SharedServices;

/// The report on the file a request body holds, any content type (`POST /v1/pickle/scan`).
pub async fn from_body(
    state: &SharedServices,
    key: &Key,
    body: Body,
) -> Result<serde_json::Value, Error> {
    if state.is_shutting_down() {
        return Err(Error::shutting_down());
    }
    let ReadBody { bytes, share } = read_body_as(state, key, body, false).await?;
    // A bounded number at once: a scan may hold much more memory than its body.
    let turn = state.pickle_slots.acquire().await;
    let _turn = turn.map_err(|_| Error::shutting_down())?;
    let opts = state.config.pickle.options();
    let report =
        tokio::task::spawn_blocking(move || airlock_pickle::scan_file(&bytes, &opts).to_json())
            .await
            .map_err(|e| Error::internal(format!("scanning: {e}")))?;
    drop(share);
    let verdict = report["verdict"].as_str().unwrap_or("malformed").to_owned();
    state.metrics.pickle_scans.add(&[&verdict]);
    Ok(report)
}
