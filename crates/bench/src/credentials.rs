//! `--credentials`: what a credential costs a request (issue 49's target: under 2 ms added
//! on loopback, after the handshake). The real egress proxy (`airlock_egress::Leash`) serves
//! a loopback listener; an HTTPS server of this process answers each request with a small
//! body on a kept-alive connection. Three series, one request after another on one
//! connection each, handshakes excluded: straight to the server (the floor), through a plain
//! `CONNECT` tunnel (TLS end to end), and through the credential's interception (TLS ended
//! by the proxy, the header set, the answer scanned, TLS again to the server).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use airlock_egress::{
    Credential, EgressPolicy, HostRule, Interception, Leash, RangeRule, SetHeader, Settings,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use crate::Series;

const SECRET: &str = "bench-secret-0123456789abcdef";
const BODY: &[u8] = b"{\"ok\": true, \"items\": [1, 2, 3]}";
/// The larger answer: 256 KiB of JSON-like text, scanned all through.
fn large() -> Vec<u8> {
    let mut v = Vec::with_capacity(256 * 1024);
    while v.len() < 256 * 1024 - BODY.len() {
        v.extend_from_slice(b"{\"id\": 12345, \"name\": \"an item of a list\"},\n");
    }
    v.extend_from_slice(BODY);
    v
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A test CA and a certificate for `api.test` from it.
fn upstream_certificates() -> Result<(CertificateDer<'static>, rustls::ServerConfig), String> {
    let e = |e: rcgen::Error| e.to_string();
    let ca_key = rcgen::KeyPair::generate().map_err(e)?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).map_err(e)?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).map_err(e)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().map_err(e)?;
    let leaf = rcgen::CertificateParams::new(vec!["api.test".to_owned()])
        .map_err(e)?
        .signed_by(&key, &issuer)
        .map_err(e)?;
    let config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| e.to_string())?;
    Ok((ca.der().clone(), config))
}

/// Answers every request on every connection with `BODY`, keeping connections open.
/// Answers `/large` with [`large`].
fn serve_upstream(listener: TcpListener, config: Arc<rustls::ServerConfig>) {
    let large = Arc::new(large());
    for stream in listener.incoming().flatten() {
        let large = large.clone();
        let config = config.clone();
        std::thread::spawn(move || {
            let _ = stream.set_nodelay(true);
            let Ok(conn) = rustls::ServerConnection::new(config) else {
                return;
            };
            let mut tls = rustls::StreamOwned::new(conn, stream);
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    let body: &[u8] = if buf.starts_with(b"GET /large") {
                        &large
                    } else {
                        BODY
                    };
                    buf.drain(..end + 4);
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                        body.len()
                    );
                    let mut out = answer.into_bytes();
                    out.extend_from_slice(body);
                    if tls.write_all(&out).is_err() {
                        return;
                    }
                }
                match tls.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
        });
    }
}

/// A TLS client to `api.test` over `stream`, trusting `root`.
fn client(
    root: CertificateDer<'static>,
    stream: TcpStream,
) -> Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root).map_err(|e| e.to_string())?;
    let config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = ServerName::try_from("api.test").map_err(|e| e.to_string())?;
    let conn = rustls::ClientConnection::new(Arc::new(config), name).map_err(|e| e.to_string())?;
    let _ = stream.set_nodelay(true);
    let mut tls = rustls::StreamOwned::new(conn, stream);
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .map_err(|e| format!("handshake: {e}"))?;
    }
    Ok(tls)
}

/// `CONNECT api.test:port` through the proxy at `proxy`.
fn tunnel(proxy: u16, port: u16) -> Result<TcpStream, String> {
    let mut s = TcpStream::connect(("127.0.0.1", proxy)).map_err(|e| e.to_string())?;
    write!(
        s,
        "CONNECT api.test:{port} HTTP/1.1\r\nHost: api.test:{port}\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).map_err(|e| e.to_string())? == 0 {
            return Err("the proxy closed".into());
        }
        head.push(b[0]);
    }
    if !head.starts_with(b"HTTP/1.1 200") {
        return Err(String::from_utf8_lossy(&head).into_owned());
    }
    Ok(s)
}

/// `rounds` requests on one connection, each timed from its first byte sent to its last
/// byte read.
fn series(
    name: &str,
    tls: &mut rustls::StreamOwned<rustls::ClientConnection, TcpStream>,
    port: u16,
    rounds: usize,
    path: &str,
) -> Result<Series, String> {
    let mut s = Series::new(name);
    let request = format!("GET {path} HTTP/1.1\r\nHost: api.test:{port}\r\nAccept: */*\r\n\r\n");
    let mut buf = vec![0u8; 8192];
    for i in 0..rounds + 20 {
        let started = Instant::now();
        tls.write_all(request.as_bytes())
            .map_err(|e| e.to_string())?;
        let mut got = Vec::new();
        loop {
            let n = tls.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("{name}: the connection closed"));
            }
            got.extend_from_slice(&buf[..n]);
            if got.ends_with(BODY) && got.len() > BODY.len() + 40 {
                break;
            }
        }
        // The first twenty warm the connection up.
        if i >= 20 {
            s.samples.push(started.elapsed());
        }
    }
    Ok(s)
}

pub fn measure(rounds: usize) -> Result<(), String> {
    let (upstream_ca, server_config) = upstream_certificates()?;
    let upstream = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let port = upstream.local_addr().map_err(|e| e.to_string())?.port();
    let server_config = Arc::new(server_config);
    std::thread::spawn(move || serve_upstream(upstream, server_config));

    let policy = EgressPolicy {
        hosts: vec![HostRule {
            host: "api.test".into(),
            ports: vec![port],
        }],
        ranges: vec![RangeRule {
            cidr: "127.0.0.0/8".into(),
            ports: vec![port],
        }],
    };
    let mut settings = Settings::default();
    settings
        .resolve
        .insert("api.test".into(), vec!["127.0.0.1".parse().unwrap()]);
    settings.max_bytes_in = u64::MAX / 2;
    settings.max_bytes_out = u64::MAX / 2;
    let settings = Arc::new(settings);

    let mut roots = rustls::RootCertStore::empty();
    roots.add(upstream_ca.clone()).map_err(|e| e.to_string())?;
    let credential = Credential::new(
        "bench",
        policy.hosts.clone(),
        vec![SetHeader {
            name: "Authorization".into(),
            value: format!("Bearer {SECRET}"),
            secret: SECRET.into(),
        }],
        Arc::new(airlock_egress::intercept::upstream_config(roots)?),
    )?;
    let dir = std::env::temp_dir();
    let credential = Arc::new(credential);
    let interception =
        Arc::new(Interception::new(vec![credential.clone()], &dir).map_err(|e| e.to_string())?);
    // The CA the sandbox would trust: the last certificate of its bundle.
    let bundle = std::fs::read_to_string(interception.trust_bundle()).map_err(|e| e.to_string())?;
    let ca_pem = bundle
        .rsplit("-----BEGIN CERTIFICATE-----")
        .next()
        .map(|tail| format!("-----BEGIN CERTIFICATE-----{tail}"))
        .ok_or("no CA in the bundle")?;
    let intercept_ca = {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(ca_pem.as_bytes()).map_err(|e| e.to_string())?
    };

    let plain_leash = Arc::new(Leash::new(policy.clone(), settings.clone(), "bench", None));
    let credential_leash = Arc::new(
        Leash::new(policy, settings, "bench", None).with_interception(interception.clone()),
    );
    let listen = |leash: &Arc<Leash>| -> Result<(u16, airlock_egress::Serving), String> {
        let l = TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let p = l.local_addr().map_err(|e| e.to_string())?.port();
        Ok((p, leash.serve(l).map_err(|e| e.to_string())?))
    };
    let (plain_port, _plain) = listen(&plain_leash)?;
    let (cred_port, _cred) = listen(&credential_leash)?;
    plain_leash.begin("bench-plain");
    credential_leash.begin("bench-credential");

    let mut direct = client(
        upstream_ca.clone(),
        TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?,
    )?;
    let mut plain = client(upstream_ca, tunnel(plain_port, port)?)?;
    let mut intercepted = client(intercept_ca, tunnel(cred_port, port)?)?;
    for (label, path) in [
        ("small answer, 34 B", "/v1/items?page=2"),
        ("large answer, 256 KiB", "/large"),
    ] {
        // Taking turns, so that a noisy moment falls on all three alike.
        let mut all = [
            Series::new("straight to the server (no proxy)"),
            Series::new("plain CONNECT tunnel (TLS end to end)"),
            Series::new("credential interception (header set, answer scanned)"),
        ];
        let turn = (rounds / 10).max(1);
        for _ in 0..10 {
            for (i, tls) in [&mut direct, &mut plain, &mut intercepted]
                .into_iter()
                .enumerate()
            {
                let s = series("", tls, port, turn, path)?;
                all[i].samples.extend(s.samples);
            }
        }
        println!(
            "credentials, {label}: one request after another on a kept-alive connection, \
             handshakes excluded ({} requests each)",
            all[0].samples.len()
        );
        let us = |d: std::time::Duration| d.as_secs_f64() * 1e6;
        println!("{:<58} {:>9} {:>9}", "", "p50 µs", "p99 µs");
        for s in &all {
            println!(
                "{:<58} {:>9.1} {:>9.1}",
                s.name,
                us(s.quantile(0.5)),
                us(s.quantile(0.99))
            );
        }
        let added = |q: f64| us(all[2].quantile(q)) - us(all[1].quantile(q));
        println!(
            "added by the interception over the plain tunnel: p50 {:+.1} µs, p99 {:+.1} µs \
             (target: under 2 ms)\n",
            added(0.5),
            added(0.99)
        );
    }
    // What a credential adds to an execution's start: its leash's CA and trust bundle.
    let mut made = Series::new("a leash's CA and trust bundle");
    for _ in 0..100 {
        let started = Instant::now();
        let ix = Interception::new(vec![credential.clone()], &dir).map_err(|e| e.to_string())?;
        made.samples.push(started.elapsed());
        drop(ix);
    }
    println!(
        "a leash's CA and trust bundle, made once per execution with a credential: p50 {} ms, \
         p99 {} ms",
        crate::ms(made.quantile(0.5)),
        crate::ms(made.quantile(0.99))
    );
    let usage = credential_leash.usage();
    println!(
        "requests that carried the credential: {}",
        usage.credential_requests
    );
    Ok(())
}
