//! A tar's headers cost work linear in its size, whatever their layout: pax global records
//! are looked up, not copied into every member, and what is copied is charged to a budget.

use std::io::Write;
use std::process::{Command, Stdio};

use airlock_pickle::{scan_file, tar_work_limit, FileReport, Options, Verdict};

fn header(name: &[u8], size: usize, kind: u8) -> Vec<u8> {
    let mut h = vec![0u8; 512];
    h[..name.len()].copy_from_slice(name);
    h[100..107].copy_from_slice(b"0000644");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[136..147].copy_from_slice(b"00000000000");
    h[156] = kind;
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| b as u32).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

fn padded(mut body: Vec<u8>) -> Vec<u8> {
    body.resize(body.len().div_ceil(512) * 512, 0);
    body
}

fn record(key: &str, value: &str) -> Vec<u8> {
    let rest = format!(" {key}={value}\n");
    let mut len = rest.len() + 1;
    while len.to_string().len() + rest.len() != len {
        len += 1;
    }
    format!("{len}{rest}").into_bytes()
}

/// One pax global header with `records`, then `members` empty files.
fn tar(records: &[(String, String)], members: usize) -> Vec<u8> {
    let body: Vec<u8> = records.iter().flat_map(|(k, v)| record(k, v)).collect();
    let mut out = header(b"././@GlobalHead", body.len(), b'g');
    out.extend(padded(body));
    for i in 0..members {
        out.extend(header(format!("m{i}").as_bytes(), 0, b'0'));
    }
    out.extend([0u8; 1024]);
    out
}

/// Members Python's tarfile reads in `data`: the generator makes real archives.
fn tarfile_members(data: &[u8]) -> usize {
    let mut child = Command::new("/usr/bin/python3")
        .args([
            "-c",
            "import io, sys, tarfile\n\
             t = tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()), mode='r:')\n\
             print(len(t.getmembers()))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run /usr/bin/python3");
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn scanned(data: &[u8]) -> (Verdict, usize, usize) {
    match scan_file(data, &Options::default()) {
        FileReport::Tar {
            members,
            verdict,
            work,
        } => (verdict, members.len(), work),
        other => panic!("not read as a tar: {:?}", other.verdict()),
    }
}

#[test]
fn many_global_records_before_many_members_cost_linear_work() {
    // 100 000 global keys, then 2 000 members: copying the records per member (what tarfile
    // does for an extended header) would be 200 million entries.
    let records: Vec<(String, String)> = (0..100_000)
        .map(|i| (format!("k{i}"), String::new()))
        .collect();
    // tarfile reads the layout (on a smaller one: it applies the global records to each
    // member one by one, which is itself quadratic).
    assert_eq!(tarfile_members(&tar(&records[..1_000], 200)), 200);
    let data = tar(&records, 2_000);
    let (verdict, members, work) = scanned(&data);
    assert_eq!(verdict, Verdict::Safe);
    assert_eq!(members, 2_000);
    // Each header once, the records' blocks once, the names the members carry.
    assert!(
        work <= 2 * data.len(),
        "work {work} for {} bytes",
        data.len()
    );
    assert!(
        work >= data.len() - 1024,
        "work {work} for {} bytes",
        data.len()
    );

    // Twice the members: twice the headers, not twice the records per member.
    let (_, _, work2) = scanned(&tar(&records, 4_000));
    assert!(work2 - work <= 2_000 * 600, "{work} then {work2}");
}

#[test]
fn a_long_global_path_given_to_every_member_is_over_the_budget() {
    // One 64 KiB path that every member takes as its name: 512 bytes of header each that
    // would cost 64 KiB of copy each.
    let path = "p".repeat(64 << 10);
    let data = tar(&[("path".into(), path)], 2_000);
    assert_eq!(tarfile_members(&data), 2_000);
    let (verdict, members, work) = scanned(&data);
    match verdict {
        Verdict::Malformed { reason, .. } => {
            assert!(
                reason.contains("more work than its size allows"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(members < 2_000);
    assert!(
        work <= tar_work_limit(data.len()) + (64 << 10) + 512,
        "stopped once over the budget: {work}"
    );

    // The same path for a few members is an archive like any other.
    let data = tar(&[("path".into(), "p".repeat(64 << 10))], 8);
    assert_eq!(scanned(&data).0, Verdict::Safe);
}
