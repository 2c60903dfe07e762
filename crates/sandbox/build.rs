//! Compiles the seccomp profile (`seccomp/x86_64.json`) into the programs the crate embeds,
//! with the same code the tests check them against (`src/seccomp_profile.rs`).

#[allow(dead_code)]
#[path = "src/seccomp_profile.rs"]
mod seccomp_profile;

fn main() {
    println!("cargo:rerun-if-changed=seccomp/x86_64.json");
    println!("cargo:rerun-if-changed=src/seccomp_profile.rs");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"))
        .join("seccomp_filters.bin");
    // Only x86_64 has a profile; elsewhere the crate refuses to confine (UnsupportedArch).
    let bytes = if std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64") {
        let json = std::fs::read_to_string("seccomp/x86_64.json").expect("seccomp/x86_64.json");
        let parts = seccomp_profile::compile_parts(&json)
            .unwrap_or_else(|e| panic!("the seccomp profile does not compile: {e}"));
        seccomp_profile::encode(&parts)
    } else {
        Vec::new()
    };
    std::fs::write(&out, bytes).expect("writing the compiled seccomp profile");
    build_id();
}

/// `AIRLOCK_SANDBOX_BUILD`: a digest of everything that decides how host and init talk (this
/// crate's sources and profile, the locked dependencies), so that a host never hands its
/// sandboxes to a separately built init binary from other sources (see `Prestarted`).
fn build_id() {
    use std::hash::Hasher;
    println!("cargo:rerun-if-changed=src");
    println!("cargo:rerun-if-changed=Cargo.toml");
    println!("cargo:rerun-if-changed=../../Cargo.lock");
    let mut files = vec![
        std::path::PathBuf::from("Cargo.toml"),
        std::path::PathBuf::from("seccomp/x86_64.json"),
        std::path::PathBuf::from("../../Cargo.lock"),
    ];
    let mut dirs = vec![std::path::PathBuf::from("src")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("reading the crate's sources") {
            let path = entry.expect("reading the crate's sources").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    // Deterministic (fixed keys): the same sources give the same id in every build.
    let mut hasher = std::hash::DefaultHasher::new();
    for file in &files {
        hasher.write(file.to_string_lossy().as_bytes());
        hasher.write(&std::fs::read(file).unwrap_or_default());
    }
    println!(
        "cargo:rustc-env=AIRLOCK_SANDBOX_BUILD={:016x}",
        hasher.finish()
    );
}
