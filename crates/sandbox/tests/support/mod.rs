//! The harness of the sandbox crate's test binaries, which have their own `main` because each
//! is also its sandboxes' init: runs the tests whose names contain any argument given (all of
//! them without one), and prints what libtest would; and the policy they start from.

use std::io::Read;

use airlock_sandbox::{Child, Policy, RootEntry};

/// Everything the sandbox writes to its stdout, until it closes it.
#[allow(dead_code)] // not every test binary reads a sandbox's stdout this way
pub fn stdout_of(child: &mut Child) -> String {
    let mut out = String::new();
    child
        .take_stdout()
        .expect("the sandbox's stdout")
        .read_to_string(&mut out)
        .expect("reading the sandbox's stdout");
    out
}

/// The default policy with `/usr` read-only and the usual links into it.
pub fn usr_policy() -> Policy {
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
    policy
}

pub fn run_tests(tests: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let mut ran = 0;
    for (name, test) in tests {
        if !filter.is_empty() && !filter.iter().any(|f| name.contains(f.as_str())) {
            continue;
        }
        print!("test {name} ... ");
        test();
        println!("ok");
        ran += 1;
    }
    println!("\ntest result: ok. {ran} passed");
}
