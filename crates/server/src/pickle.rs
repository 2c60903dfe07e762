//! `POST /v1/pickle/scan`: a pickle or a ZIP archive of them, scanned without being run. The
//! body is the file itself, any content type.

use axum::extract::{Request, State};
use axum::{Extension, Json};

use crate::config::Scope;
use crate::error::Error;
use crate::guard::Caller;
use crate::pipeline::{read_body_as, require, ReadBody};
use crate::SharedState;

pub(crate) async fn scan(
    State(state): State<SharedState>,
    Extension(caller): Extension<Caller>,
    req: Request,
) -> Result<Json<serde_json::Value>, Error> {
    require(&caller, Scope::Execute)?;
    if state.is_shutting_down() {
        return Err(crate::pipeline::shutting_down());
    }
    let ReadBody { bytes, share } = read_body_as(&state, &caller.0, req, false).await?;
    // A bounded number at once: a scan may hold much more memory than its body.
    let turn = state.pickle_slots.acquire().await;
    let _turn = turn.map_err(|_| crate::pipeline::shutting_down())?;
    let opts = state.config.pickle.options();
    let report =
        tokio::task::spawn_blocking(move || airlock_pickle::scan_file(&bytes, &opts).to_json())
            .await
            .map_err(|e| Error::internal(format!("scanning: {e}")))?;
    drop(share);
    let verdict = report["verdict"].as_str().unwrap_or("malformed").to_owned();
    state.metrics.pickle_scans.add(&[&verdict]);
    Ok(Json(report))
}
