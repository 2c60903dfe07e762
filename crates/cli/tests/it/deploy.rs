//! deploy/: the systemd unit is one systemd accepts, its exposure stays where
//! docs/deploying.md says, and airlock works under the capability bounding set and no_new_privs it
//! gives (no systemd runs here as PID 1, so the server runs under setpriv with the same).

use crate::common;

use std::path::Path;
use std::process::Command;

use common::http::{call_as, Server, KEY};
use common::*;
use serde_json::json;

const UNIT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/systemd/airlock.service"
);

/// The unit with its binary path pointed at the one under test (verify checks it exists),
/// as `airlock.service` in a scratch directory.
fn unit_for_test() -> Scratch {
    let text = std::fs::read_to_string(UNIT).unwrap();
    assert!(text.contains("ExecStart=/usr/local/bin/airlock serve"));
    let dir = scratch_dir("airlock-unit");
    std::fs::write(
        dir.join("airlock.service"),
        text.replace("/usr/local/bin/airlock", env!("CARGO_BIN_EXE_airlock")),
    )
    .unwrap();
    dir
}

#[test]
fn the_systemd_unit_verifies_and_its_exposure_is_what_the_readme_says() {
    let dir = unit_for_test();
    let unit = dir.join("airlock.service");
    let verify = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&unit)
        .output()
        .expect("systemd-analyze (Debian's systemd)");
    assert!(
        verify.status.success() && verify.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&verify.stderr)
    );
    let security = Command::new("systemd-analyze")
        .args(["security", "--offline=true"])
        .arg(&unit)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&security.stdout);
    let exposure: f64 = out
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for airlock.service: ")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in: {out}"));
    assert!(
        exposure <= 6.0,
        "exposure {exposure} > 6.0 (docs/deploying.md says 6.0)"
    );
}

/// `CapabilityBoundingSet=` of the unit, as `CAP_` names.
fn unit_capabilities() -> Vec<String> {
    let text = std::fs::read_to_string(UNIT).unwrap();
    let caps: Vec<String> = text
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .expect("the unit bounds capabilities")
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(caps.len(), 5, "{caps:?}");
    caps
}

/// `caps`, as setpriv's `--bounding-set` wants them.
fn setpriv_bounding_set<'a>(caps: impl IntoIterator<Item = &'a String>) -> String {
    let caps: Vec<String> = caps
        .into_iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    format!("--bounding-set=-all,{}", caps.join(","))
}

/// The unit's bounding set, as setpriv's `--bounding-set` wants it.
fn bounding_set() -> String {
    setpriv_bounding_set(&unit_capabilities())
}

#[test]
fn without_each_of_the_unit_s_capabilities_doctor_fails_and_names_it() {
    let _g = serial();
    let before = HostState::now();
    let caps = unit_capabilities();
    for missing in &caps {
        let set = setpriv_bounding_set(caps.iter().filter(|c| *c != missing));
        let mut child = Command::new("setpriv")
            .args(["--no-new-privs", &set, "--inh-caps=-all", "--"])
            .arg(env!("CARGO_BIN_EXE_airlock"))
            .args(["doctor", "--json"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        // A doctor that cannot kill its trial sandboxes would wait for them forever.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                panic!("doctor without {missing} never finished");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "doctor passed without {missing}");
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let failed: Vec<String> = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["ok"] == false)
            .map(|c| format!("{}: {} ({})", c["name"], c["detail"], c["fix"]))
            .collect();
        assert!(
            failed.first().is_some_and(|f| f.contains(missing.as_str())),
            "doctor without {missing}: {failed:#?}"
        );
    }
    HostState::now().assert_same_as(&before, &"doctor without each capability");
}

#[test]
fn the_server_works_with_only_the_unit_s_capabilities_and_no_new_privileges() {
    let _g = serial();
    let before = HostState::now();
    assert!(std::fs::read_to_string(UNIT)
        .unwrap()
        .contains("\nNoNewPrivileges=yes\n"));
    let set = bounding_set();
    let wrapper = ["setpriv", "--no-new-privs", &set, "--inh-caps=-all", "--"];
    // Zygotes on: they are what needs root's uid blocks, so they must work under the set.
    let server = Server::start_under(
        &wrapper,
        scratch_dir("airlock-unit-caps").into_path(),
        "[zygote]\nenabled = true\n",
        &[],
        Some(KEY),
    );
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.child.id())).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap()
            .to_owned()
    };
    // CAP_DAC_OVERRIDE(1) CAP_KILL(5) CAP_SETGID(6) CAP_SETUID(7) CAP_SYS_ADMIN(21).
    assert_eq!(field("CapBnd:"), "00000000002000e2");
    assert_eq!(field("NoNewPrivs:"), "1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.metric("airlock_zygotes_ready") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no zygote became ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let r = call_as(
        server.addr,
        KEY,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "print(6 * 7)"})),
    );
    assert_eq!(
        (r.status, r.json()["stdout"].as_str()),
        (200, Some("42\n")),
        "{}",
        r.text()
    );
    let opened = call_as(server.addr, KEY, "POST", "/v1/sessions", Some(&json!({})));
    assert_eq!(opened.status, 201, "{}", opened.text());
    let id = opened.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/sessions/{id}/execute");
    call_as(
        server.addr,
        KEY,
        "POST",
        &path,
        Some(&json!({"code": "x = 2"})),
    );
    let r = call_as(
        server.addr,
        KEY,
        "POST",
        &path,
        Some(&json!({"code": "print(x + 1)"})),
    );
    assert_eq!(r.json()["stdout"], "3\n", "{}", r.text());
    // A limit is still enforced (the cgroup is written under the set).
    let r = call_as(
        server.addr,
        KEY,
        "POST",
        "/v1/execute",
        Some(&json!({"code": "b = bytearray(400 << 20)", "limits": {"memory_mb": 64}})),
    );
    assert_eq!(r.json()["status"], "memory_limit", "{}", r.text());
    let ready = call_as(server.addr, KEY, "GET", "/readyz", None);
    assert_eq!(ready.status, 200, "{}", ready.text());
    // Sandboxes came from zygotes, and none failed.
    let children = server.metric("airlock_zygote_children_total");
    assert!(
        children >= 2.0,
        "{children}: {}",
        server.call("GET", "/metrics", None).text()
    );
    assert_eq!(server.metric("airlock_zygote_failures_total"), 0.0);
    assert!(server.stop().success());
    HostState::now().assert_same_as(&before, &"under the unit's capabilities");
}

const KUBERNETES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/kubernetes");

fn kustomize(dir: &str) -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(format!("{KUBERNETES}/{dir}"))
        .output()
        .expect("kubectl (scripts/test.sh: ensure_kubernetes_tools)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_kubernetes_manifests_build_and_match_the_api_s_schemas() {
    let validate = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/kubernetes-validate/bin/kubernetes-validate");
    assert!(
        validate.exists(),
        "kubernetes-validate is not installed: run `bash -c '. scripts/lib.sh && ensure_kubernetes_tools'`"
    );
    let dir = scratch_dir("airlock-k8s");
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = kustomize("base");
    let file = dir.join("base.yaml");
    std::fs::write(&file, &yaml).unwrap();
    // Strict: an unknown or misplaced field fails, against the oldest API the manifests
    // need (appArmorProfile: 1.30).
    let out = Command::new(&validate)
        .args(["--strict", "-k", "1.30"])
        .arg(&file)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !said.contains("ERROR"), "{said}");
    for kind in [
        "Namespace",
        "StatefulSet",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "NetworkPolicy",
        "ConfigMap",
    ] {
        assert!(
            yaml.contains(&format!("\nkind: {kind}\n")),
            "the manifests have no {kind}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);

    // The pod's capabilities are the systemd unit's, its probes the server's.
    let sts = std::fs::read_to_string(format!("{KUBERNETES}/base/statefulset.yaml")).unwrap();
    let unit = std::fs::read_to_string(UNIT).unwrap();
    let unit_caps: Vec<&str> = unit
        .lines()
        .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
        .unwrap()
        .split_whitespace()
        .map(|c| c.trim_start_matches("CAP_"))
        .collect();
    assert_eq!(statefulset_capabilities(&sts), unit_caps);
    for needed in [
        "drop: [ALL]",
        "allowPrivilegeEscalation: false",
        "readOnlyRootFilesystem: true",
        "type: RuntimeDefault",
        "path: /healthz",
        "path: /readyz",
        "fieldPath: metadata.name",
        "prometheus.io/scrape: \"true\"",
    ] {
        assert!(sts.contains(needed), "the StatefulSet lacks {needed}");
    }
    assert!(!sts.contains("procMount: Unmasked") && !sts.contains("privileged: true"));

    // The pods' configuration is one the server accepts, keyless probes and all.
    let config = format!("{KUBERNETES}/base/airlock.toml");
    let out = airlock()
        .args(["serve", "--print-config", "--config", &config])
        .env("AIRLOCK_REPLICA", "airlock-0")
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        printed.contains("readyz_without_key = true")
            && printed.contains("replica = \"airlock-0\"")
    );
}
