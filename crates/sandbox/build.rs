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
}
