//! The runner: the first Python code of every sandbox (`runner.py`), and the rest of it
//! (`runner_more.py`), compiled only when something needs it.

use std::sync::OnceLock;

/// The rest of the runner, sent with each request and compiled only when needed (see
/// runner.py).
pub(crate) const MORE: &str = include_str!("runner_more.py");

/// The runner, passed to `python3 -c`: how a sandbox's Python ends as a zygote's children do
/// (the sandbox crate's `FINISH_PY`), then `runner.py`.
pub fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| [airlock_sandbox::FINISH_PY, include_str!("runner.py")].concat())
}
