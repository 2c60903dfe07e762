//! One connection to PostgreSQL and its deadlines: every operation, connecting included, is
//! bounded by airlock's own clock (see the store's docs), and the connection's settings and
//! TLS come from `[store]`.

use std::str::FromStr;
use std::time::Duration;

use tokio_postgres::Client;
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::Config;

/// The most connecting may take, TLS and authentication included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an execution waits for its `started` line or record to be committed before the
/// store counts as failing; also the bound on each statement and on unacknowledged data.
pub(super) const COMMIT_WAIT: Duration = Duration::from_secs(10);
/// The most any one operation on a connection may take (a batch's insert, a read, a step of
/// the start) before the connection is dropped: airlock's own clock, which a stopped server
/// cannot hold up.
const OPERATION_DEADLINE: Duration = COMMIT_WAIT;
/// How long a connection that is let go gets to say goodbye.
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The connection settings: the URL, with the password from its file, else the one the binary
/// gave (`AIRLOCK_STORE_PASSWORD`).
pub(super) fn connection(config: &Config) -> std::io::Result<tokio_postgres::Config> {
    let url = config.store.url.as_deref().unwrap_or_default();
    let mut pg = tokio_postgres::Config::from_str(url).map_err(std::io::Error::other)?;
    let password = match &config.store.password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
                .trim_end_matches(['\n', '\r'])
                .to_owned(),
        ),
        None => config.store.password.as_ref().map(|p| p.text().to_owned()),
    };
    if let Some(password) = password {
        pg.password(password);
    }
    pg.connect_timeout(CONNECT_TIMEOUT);
    // A host that vanishes is a failure within seconds, not TCP's minutes: data unacknowledged
    // for 10 s, or an idle connection whose probes go unanswered for about 16 s, ends the
    // connection. (A stopped server's kernel still answers both: `Db`'s deadlines cover it.)
    pg.tcp_user_timeout(COMMIT_WAIT);
    pg.keepalives_idle(Duration::from_secs(10));
    pg.keepalives_interval(Duration::from_secs(2));
    pg.keepalives_retries(3);
    let options = pg.get_options().unwrap_or_default().to_owned();
    pg.options(format!(
        "{options} -c statement_timeout={}",
        COMMIT_WAIT.as_millis()
    ));
    if pg.get_application_name().is_none() {
        pg.application_name("airlock");
    }
    Ok(pg)
}

/// TLS to the database: its certificate verified against the system's authorities and
/// `store.ca_file`'s, its name against the URL's host. Used when the server offers TLS (the
/// URL's `sslmode=prefer`, the default), required with `sslmode=require`.
pub(super) fn tls(config: &Config) -> std::io::Result<MakeRustlsConnect> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    if let Some(path) = &config.store.ca_file {
        let named = |e: &dyn std::fmt::Display| {
            std::io::Error::other(format!("store.ca_file {}: {e}", path.display()))
        };
        let pem = std::fs::read(path).map_err(|e| named(&e))?;
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(&pem) {
            roots
                .add(cert.map_err(|e| named(&e))?)
                .map_err(|e| named(&e))?;
            added += 1;
        }
        if added == 0 {
            return Err(named(&"holds no PEM certificate"));
        }
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(std::io::Error::other)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(MakeRustlsConnect::new(tls))
}

pub(super) fn db_error(what: &str, e: tokio_postgres::Error) -> std::io::Error {
    // The server's own message (a constraint, a permission) says more than the error's kind.
    let detail = e
        .as_db_error()
        .map_or_else(|| e.to_string(), |d| d.message().to_owned());
    std::io::Error::other(format!("PostgreSQL, {what}: {detail}"))
}

/// An operation that ran out of time.
fn late(what: &str, after: Duration) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("PostgreSQL, {what}: no answer in {} s", after.as_secs()),
    )
}

/// One connection, each operation on it bounded by `OPERATION_DEADLINE` (connecting by
/// `CONNECT_TIMEOUT`), after which it is dropped: its caller sees an error and connects
/// again. The client runs on a current-thread runtime of its own, driven only while an
/// operation waits, so a `Db` is used and dropped only on threads that are not the server's
/// (the writer's, the blocking pool's, a scoped thread at start).
pub(super) struct Db {
    client: Option<Client>,
    connection: Option<tokio::task::JoinHandle<()>>,
    /// An operation ran out of time: the connection is closed at once, without a goodbye.
    abandoned: bool,
    /// Dropped last: with it go the connection's task and its socket.
    runtime: tokio::runtime::Runtime,
}

impl Db {
    pub(super) fn connect(
        config: &tokio_postgres::Config,
        tls: &MakeRustlsConnect,
    ) -> std::io::Result<Db> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        // `connect_timeout` bounds only the TCP handshake, which a stopped server's kernel
        // completes; the startup and authentication after it get the same bound here.
        // (A timer is made inside the runtime.)
        let connecting =
            async { tokio::time::timeout(CONNECT_TIMEOUT, config.connect(tls.clone())).await };
        let (client, connection) = match runtime.block_on(connecting) {
            Ok(connected) => connected.map_err(|e| db_error("connecting", e))?,
            Err(_) => return Err(late("connecting", CONNECT_TIMEOUT)),
        };
        let connection = runtime.spawn(async move {
            let _ = connection.await;
        });
        Ok(Db {
            client: Some(client),
            connection: Some(connection),
            abandoned: false,
            runtime,
        })
    }

    /// Runs `op` on the connection: its error, or one when it did not end within
    /// `OPERATION_DEADLINE` (the connection must then be dropped).
    pub(super) fn run<T>(
        &mut self,
        what: &str,
        op: impl AsyncFnOnce(&mut Client) -> std::io::Result<T>,
    ) -> std::io::Result<T> {
        let Some(client) = self.client.as_mut() else {
            return Err(std::io::Error::other(
                "PostgreSQL: the connection is closed",
            ));
        };
        match self
            .runtime
            .block_on(async { tokio::time::timeout(OPERATION_DEADLINE, op(client)).await })
        {
            Ok(done) => done,
            Err(_) => {
                self.abandoned = true;
                Err(late(what, OPERATION_DEADLINE))
            }
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        // Without its client, the connection says goodbye (`Terminate`) and closes, unless
        // an answer is still awaited: one abandoned is closed at once, with the runtime.
        drop(self.client.take());
        if let Some(connection) = self.connection.take().filter(|_| !self.abandoned) {
            let _ = self
                .runtime
                .block_on(async { tokio::time::timeout(CLOSE_WAIT, connection).await });
        }
    }
}
