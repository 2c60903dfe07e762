//! Runs a command in a sandbox whose root holds the host's /usr (read-only) and the usual
//! merged-/usr links: `cargo run --example jail -- /usr/bin/python3 -c 'print(1)'`.

use std::io::Read;

use airlock_sandbox::{run_if_init, spawn, Command, Policy, RootEntry};

fn main() {
    run_if_init();
    let mut argv = std::env::args().skip(1);
    let program = argv.next().expect("usage: jail PROGRAM [ARG...]");
    let mut policy = Policy::default();
    policy.root.push(RootEntry::ReadOnly {
        source: "/usr".into(),
        target: "/usr".into(),
    });
    for (link, target) in [
        ("/bin", "usr/bin"),
        ("/lib", "usr/lib"),
        ("/lib64", "usr/lib64"),
    ] {
        policy.root.push(RootEntry::Symlink {
            target: target.into(),
            path: link.into(),
        });
    }
    let mut child = spawn(
        Command::new(program).args(argv).env("PATH", "/usr/bin"),
        &policy,
    )
    .unwrap_or_else(|e| panic!("spawn: {e}"));
    let mut out = child.take_stdout().expect("stdout");
    let mut err = child.take_stderr().expect("stderr");
    let pump = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let mut stdout = String::new();
    let _ = out.read_to_string(&mut stdout);
    let stderr = pump.join().unwrap_or_default();
    let outcome = child.wait();
    print!("{stdout}");
    eprint!("{stderr}");
    eprintln!("{outcome:#?}");
}
