//! The sandbox's outer init on its own: what `airlock run` starts ahead of a sandbox
//! (`airlock_sandbox::Prestarted`), a small binary that starts faster than airlock's own.

fn main() {
    airlock_sandbox::run_if_init();
    eprintln!("airlock-sandbox-init is started by airlock, not by hand");
    std::process::exit(2);
}
