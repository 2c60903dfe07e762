//! `airlock-bench`: start-up cost and throughput, side by side, in one run.
//!
//! Interleaves, round by round: a bare `/usr/bin/python3 -I -S -c pass`, the same under
//! `bwrap` (Debian's bubblewrap), `airlock run` one-shot, and `print(1)` over the HTTP API.
//! Then HTTP at concurrency 1, 2, 4 and 8 (and bare python starts on every core, for the
//! process-start ceiling), repeated in alternating blocks; then cost curves over code size and
//! output size; then the idle memory of the server and of each pooled sandbox; as root, the
//! closed loop and eight clients each against `floor.py` (a sandbox's steps and nothing else,
//! no server), eight clients and floor.py's eight workers taking `--turns` turns of
//! `--seconds`. Everything is reported as a ratio to a baseline measured in the same run
//! (bare python, or floor.py), because machines are noisy.
//!
//! Usage: `airlock-bench [--airlock PATH] [--rounds N] [--requests N] [--blocks N]`
//! (`scripts/bench.sh` builds release binaries, installs bubblewrap and runs it).

mod background;
mod credentials;
mod eval;
mod rss;
mod snapshots;
mod telemetry;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";
/// What data agents do: pandas and matplotlib, a chart, a PNG.
const DATA_SCIENCE: &str = "import pandas as pd\n\
import matplotlib.pyplot as plt\n\
df = pd.DataFrame({'x': range(100), 'y': [v * v for v in range(100)]})\n\
df.plot(x='x', y='y')\n\
plt.savefig('/tmp/chart.png')\n\
plt.close('all')\n";
const KEY: &str = "bench-key-3b1f0c5e9a7d42e8b6c4a2f0e1d3c5b7";

struct Args {
    airlock: PathBuf,
    rounds: usize,
    requests: usize,
    blocks: usize,
    /// Only the native evaluator against seed 001's subprocess.
    eval_only: bool,
    /// Only `print(1)` from this many closed-loop clients for `seconds` (a load to profile).
    load: Option<usize>,
    /// How long each turn of a load lasts (`--load`, and the full run's eight clients).
    seconds: u64,
    /// How many times a load and floor.py's take turns (`--load`, `--closed`, the full run).
    turns: usize,
    /// Only the closed loop (one client, this many requests back to back) and floor.py's,
    /// taking `turns` turns, each against bare starts timed in the same turn.
    closed: Option<usize>,
    /// Only sessions paused, resumed and forked (`--rounds` of them), with 1 GB of state
    /// (`--one-gb`) and this many paused at once (`--paused`).
    snapshots: bool,
    one_gb: bool,
    paused: usize,
    /// Only what a credential adds to a request through the egress proxy.
    credentials: bool,
    /// Only one background execution of this many minutes, followed with reconnections.
    background: Option<u64>,
    /// Only executions with traces off, to a collector, to one down and to one that never
    /// answers (`--turns` turns).
    telemetry: bool,
    /// Only the server's RSS before and after this many answers of 10 MB.
    rss: Option<usize>,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        airlock: PathBuf::from("target/release/airlock"),
        rounds: 100,
        requests: 200,
        blocks: 3,
        eval_only: false,
        load: None,
        seconds: 10,
        turns: 3,
        closed: None,
        snapshots: false,
        one_gb: false,
        paused: 0,
        credentials: false,
        background: None,
        telemetry: false,
        rss: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or(format!("{name} needs a value"));
        match a.as_str() {
            "--airlock" => args.airlock = PathBuf::from(value("--airlock")?),
            "--rounds" => args.rounds = value("--rounds")?.parse().map_err(|e| format!("{e}"))?,
            "--requests" => {
                args.requests = value("--requests")?.parse().map_err(|e| format!("{e}"))?
            }
            "--blocks" => args.blocks = value("--blocks")?.parse().map_err(|e| format!("{e}"))?,
            "--eval-only" => args.eval_only = true,
            "--snapshots" => args.snapshots = true,
            "--credentials" => args.credentials = true,
            "--background" => {
                args.background = Some(value("--background")?.parse().map_err(|e| format!("{e}"))?)
            }
            "--telemetry" => args.telemetry = true,
            "--rss" => args.rss = Some(value("--rss")?.parse().map_err(|e| format!("{e}"))?),
            "--one-gb" => args.one_gb = true,
            "--paused" => args.paused = value("--paused")?.parse().map_err(|e| format!("{e}"))?,
            "--load" => args.load = Some(value("--load")?.parse().map_err(|e| format!("{e}"))?),
            "--seconds" => {
                args.seconds = value("--seconds")?.parse().map_err(|e| format!("{e}"))?
            }
            "--turns" => args.turns = value("--turns")?.parse().map_err(|e| format!("{e}"))?,
            "--closed" => {
                args.closed = Some(value("--closed")?.parse().map_err(|e| format!("{e}"))?)
            }
            "-h" | "--help" => {
                println!("usage: airlock-bench [--airlock PATH] [--rounds N] [--requests N] [--blocks N] [--eval-only] [--load CLIENTS [--seconds S] [--turns N]] [--closed REQUESTS [--turns N]] [--snapshots [--one-gb] [--paused N]] [--credentials] [--background MINUTES] [--telemetry [--turns N]] [--rss ANSWERS]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(args)
}

/// Latencies of one series.
#[derive(Default)]
struct Series {
    name: String,
    samples: Vec<Duration>,
    /// Executions per second measured over whole blocks (concurrent series), if any.
    busy: Duration,
    done: usize,
}

impl Series {
    fn new(name: impl Into<String>) -> Self {
        Series {
            name: name.into(),
            ..Series::default()
        }
    }

    fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        if s.is_empty() {
            return Duration::ZERO;
        }
        let i = ((s.len() as f64 - 1.0) * q).round() as usize;
        s[i]
    }

    /// Per second: over the blocks when measured so, else one after another.
    fn rate(&self) -> f64 {
        if self.done > 0 {
            self.done as f64 / self.busy.as_secs_f64()
        } else {
            let total: Duration = self.samples.iter().sum();
            self.samples.len() as f64 / total.as_secs_f64()
        }
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("airlock-bench: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&args) {
        eprintln!("airlock-bench: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    if args.credentials {
        return credentials::measure(args.rounds.max(100));
    }
    let airlock = std::fs::canonicalize(&args.airlock).map_err(|e| {
        format!(
            "{}: {e} (build it with cargo build --release)",
            args.airlock.display()
        )
    })?;
    if args.telemetry {
        return telemetry::measure(&airlock, args.turns.max(1));
    }
    let bwrap = which("bwrap");
    if bwrap.is_none() {
        eprintln!(
            "airlock-bench: bwrap not found; install Debian's bubblewrap (scripts/bench.sh does)"
        );
    }
    let state = std::env::temp_dir().join(format!("airlock-bench-{}", std::process::id()));
    let server = Server::start(&airlock, &state)?;
    // The pool fills, the first requests warm up.
    std::thread::sleep(Duration::from_secs(1));
    let mut client = server.connect()?;
    if args.eval_only {
        let report = eval::measure(args.rounds, &mut client, &airlock)?;
        eval::print(&report);
        return Ok(());
    }
    for _ in 0..10 {
        client.execute("print(1)", None)?;
    }
    if args.snapshots {
        return snapshots::measure(&server, args.rounds, args.paused, args.one_gb);
    }
    if let Some(minutes) = args.background {
        return background::measure(&server, minutes);
    }
    if let Some(answers) = args.rss {
        pool_full(&mut client)?;
        settle();
        return rss::measure(&server, answers);
    }
    if let Some(clients) = args.load {
        if !nix::unistd::geteuid().is_root() {
            load(&server, clients, Duration::from_secs(args.seconds))?;
            eprintln!(
                "airlock-bench: floor.py needs root (it makes cgroups and maps a uid); not run"
            );
            return Ok(());
        }
        let secs = Duration::from_secs(args.seconds);
        let turns = load_turns(&server, clients, secs, args.turns)?;
        let (median, low, high) = turns.median();
        println!(
            "airlock's rate against floor.py's, {} turns: median {median:.2} (from {low:.2} to {high:.2})",
            turns.0.len(),
        );
        // A bare fork of the same Python doing the same work, airlock's server stopped.
        drop(server);
        settle();
        floor(
            clients,
            secs,
            "cgroup,netns,mounts,confine,namespaces,intermediate",
        )?;
        return Ok(());
    }
    if let Some(requests) = args.closed {
        if !nix::unistd::geteuid().is_root() {
            return Err("--closed runs floor.py's closed loop, which needs root".into());
        }
        return closed_turns(&server, &mut client, requests, args.turns.max(1));
    }
    pool_full(&mut client)?;
    // The data-science series once first: it starts the zygote that preloads them.
    client.execute(DATA_SCIENCE, None)?;
    wait_zygotes(&mut client)?;
    let idle_rss = rss_kib(server.child.id()).unwrap_or(0);
    let sandboxes = sandbox_pss(server.child.id(), false);
    let pooled: Vec<u64> = sandboxes.iter().filter(|s| !s.2).map(|s| s.0).collect();
    let preloaded: Vec<(u64, u64)> = sandboxes
        .iter()
        .filter(|s| s.2)
        .map(|s| (s.0, s.1))
        .collect();
    let zygotes: Vec<u64> = sandbox_pss(server.child.id(), true)
        .iter()
        .map(|s| s.0)
        .collect();
    let running = running_pss(&server, 5)?;

    // Round-robin single starts.
    let mut bare = Series::new("bare `python3 -I -S -c pass`");
    let mut bw = Series::new("`bwrap` + the same");
    let mut one_shot = Series::new("`airlock run` one-shot, `print(1)`");
    let mut http = Series::new("HTTP `print(1)`, sequential");
    let mut cells = Series::new("HTTP `print(1)` as a session cell, sequential");
    // What the interpreter of a cold sandbox does before it reads its request, with no
    // sandbox, and inside bwrap's: the floor under `airlock run`.
    let mut runner = Series::new("the runner's own start, no sandbox");
    let mut bw_runner = Series::new("`bwrap` + the runner's own start");
    let runner_argv = ["-I", "-S", "-B", "-c", airlock_engine::runner(), "--zygote"];
    let session = client.session()?;
    eprintln!("airlock-bench: {} interleaved rounds", args.rounds);
    for _ in 0..args.rounds {
        bare.samples.push(time_command(
            Command::new(PYTHON).args(["-I", "-S", "-c", "pass"]),
        )?);
        if let Some(b) = &bwrap {
            bw.samples.push(time_command(
                Command::new(b)
                    .args(BWRAP_ARGS)
                    .args([PYTHON, "-I", "-S", "-c", "pass"]),
            )?);
        }
        one_shot.samples.push(time_command_with(
            Command::new(&airlock).args(["run", "-"]),
            Some(b"print(1)\n"),
        )?);
        runner
            .samples
            .push(time_command(Command::new(PYTHON).args(runner_argv))?);
        if let Some(b) = &bwrap {
            bw_runner.samples.push(time_command(
                Command::new(b)
                    .args(BWRAP_ARGS)
                    .arg(PYTHON)
                    .args(runner_argv),
            )?);
        }
        let t = Instant::now();
        client.execute("print(1)", None)?;
        http.samples.push(t.elapsed());
        let t = Instant::now();
        client.cell(&session, "print(1)")?;
        cells.samples.push(t.elapsed());
    }
    client.delete(&format!("/v1/sessions/{session}"))?;

    // Concurrency, in alternating blocks.
    let levels = [1usize, 2, 4, 8];
    let mut conc: Vec<Series> = levels
        .iter()
        .map(|c| Series::new(format!("HTTP `print(1)`, {c} at once")))
        .collect();
    let mut cell_conc: Vec<Series> = levels
        .iter()
        .map(|c| Series::new(format!("session cells, {c} sessions at once")))
        .collect();
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let mut bare_conc = Series::new(format!("bare python starts, {cores} at once"));
    eprintln!(
        "airlock-bench: {} blocks of {} requests per level",
        args.blocks, args.requests
    );
    let made_before = histogram(&mut client, "airlock_sandbox_made_duration_seconds")?;
    let ticks_before = cpu_ticks();
    for _ in 0..args.blocks {
        block(&mut bare_conc, cores, args.requests, |_| {
            time_command(Command::new(PYTHON).args(["-I", "-S", "-c", "pass"])).map(drop)
        })?;
        for (i, &c) in levels.iter().enumerate() {
            let clients: Vec<std::sync::Mutex<Client>> = (0..c)
                .map(|_| server.connect().map(std::sync::Mutex::new))
                .collect::<Result<_, _>>()?;
            block(&mut conc[i], c, args.requests, |w| {
                clients[w]
                    .lock()
                    .unwrap()
                    .execute("print(1)", None)
                    .map(drop)
            })?;
            // The same clients, each with a session of its own.
            let sessions: Vec<String> = clients
                .iter()
                .map(|cl| cl.lock().unwrap().session())
                .collect::<Result<_, _>>()?;
            block(&mut cell_conc[i], c, args.requests, |w| {
                clients[w]
                    .lock()
                    .unwrap()
                    .cell(&sessions[w], "print(1)")
                    .map(drop)
            })?;
            for (cl, id) in clients.iter().zip(&sessions) {
                cl.lock().unwrap().delete(&format!("/v1/sessions/{id}"))?;
            }
        }
    }

    if let (Some((t0, s0)), Some((t1, s1))) = (ticks_before, cpu_ticks()) {
        let _ = STOLEN.set(100.0 * (s1 - s0) as f64 / (t1 - t0).max(1) as f64);
    }

    // Cost curves, sequential, interleaved.
    let code_sizes = [1usize << 10, 64 << 10, 512 << 10];
    let output_sizes = [1usize << 10, 64 << 10, 1 << 20];
    let mut code_series: Vec<Series> = code_sizes
        .iter()
        .map(|n| Series::new(format!("code of {}", size(*n))))
        .collect();
    let mut out_series: Vec<Series> = output_sizes
        .iter()
        .map(|n| Series::new(format!("output of {}", size(*n))))
        .collect();
    let codes: Vec<String> = code_sizes.iter().map(|&n| padded_code(n)).collect();
    let rounds = (args.rounds / 2).max(5);
    for _ in 0..rounds {
        for (i, code) in codes.iter().enumerate() {
            let t = Instant::now();
            client.execute(code, None)?;
            code_series[i].samples.push(t.elapsed());
        }
        for (i, &n) in output_sizes.iter().enumerate() {
            let code = format!("import sys\nsys.stdout.write('x' * {n})");
            let t = Instant::now();
            client.execute(&code, Some(n * 2))?;
            out_series[i].samples.push(t.elapsed());
        }
    }
    // Data science: a fresh sandbox (a child of the zygote that preloads them), the same
    // code as a cell of a session (the work itself, nothing started), and bare python with
    // matplotlib's font cache already built.
    let mut ds = Series::new("fresh sandbox: pandas + matplotlib chart saved as PNG");
    let mut ds_cell = Series::new("the same, as a session cell (no new sandbox)");
    let mut ds_bare = Series::new("the same, bare `python3` (font cache warm)");
    let mut ds_warm = Series::new(
        "the same, run again in one warm `python3` (no sandbox, nothing to start: the floor)",
    );
    let mpl_dir = state.join("mplconfig");
    std::fs::create_dir_all(&mpl_dir).map_err(|e| e.to_string())?;
    let bare_ds = || {
        time_command(
            Command::new(PYTHON)
                .args(["-c", &DATA_SCIENCE.replace("/tmp/chart.png", "/dev/null")])
                .env("MPLBACKEND", "Agg")
                .env("MPLCONFIGDIR", &mpl_dir),
        )
    };
    let made_after = histogram(&mut client, "airlock_sandbox_made_duration_seconds")?;
    let made = (made_after.1 > made_before.1).then(|| {
        (
            Duration::from_secs_f64(
                (made_after.0 - made_before.0) / (made_after.1 - made_before.1) as f64,
            ),
            made_after.1 - made_before.1,
        )
    });
    bare_ds()?;
    let mut warm = WarmPython::start(&mpl_dir)?;
    let ds_session = client.session()?;
    let clone_before = histogram(&mut client, "airlock_sandbox_start_duration_seconds")?;
    let ds_rounds = (args.rounds / 4).max(5);
    eprintln!("airlock-bench: {ds_rounds} data-science rounds");
    for _ in 0..ds_rounds {
        let t = Instant::now();
        client.execute(DATA_SCIENCE, None)?;
        ds.samples.push(t.elapsed());
        let t = Instant::now();
        client.cell(&ds_session, DATA_SCIENCE)?;
        ds_cell.samples.push(t.elapsed());
        ds_bare.samples.push(bare_ds()?);
        ds_warm.samples.push(warm.run()?);
    }
    drop(warm);
    let clone_after = histogram(&mut client, "airlock_sandbox_start_duration_seconds")?;
    client.delete(&format!("/v1/sessions/{ds_session}"))?;
    let clone = (clone_after.1 > clone_before.1).then(|| {
        Duration::from_secs_f64(
            (clone_after.0 - clone_before.0) / (clone_after.1 - clone_before.1) as f64,
        )
    });

    let status = client.get("/readyz")?;
    let eval_report = eval::measure((args.rounds / 10).max(3), &mut client, &airlock)?;
    drop(client);
    // Issue 47's throughput: eight clients against floor.py's eight workers, in turns (needs
    // root, as floor.py does).
    let eight_turns = if nix::unistd::geteuid().is_root() {
        eprintln!(
            "airlock-bench: 8 clients against floor.py's 8 workers, {} turns of {} s",
            args.turns.max(1),
            args.seconds
        );
        let secs = Duration::from_secs(args.seconds);
        Some(load_turns(&server, 8, secs, args.turns)?)
    } else {
        None
    };
    drop(server);
    let _ = std::fs::remove_dir_all(&state);
    // The same closed loop with nothing but a sandbox's steps, no server (needs root): the
    // least this machine allows today, against the same bare starts.
    let floor_closed = if nix::unistd::geteuid().is_root() {
        settle();
        Some(floor_closed_loop(args.requests)?)
    } else {
        None
    };

    report(
        args,
        &bare,
        &[&bare, &bw, &one_shot, &http, &cells, &runner, &bw_runner],
        &bare_conc,
        &conc,
        &cell_conc,
        &code_series,
        &out_series,
        &[&ds, &ds_cell, &ds_bare, &ds_warm],
        Memory {
            idle_rss_kib: idle_rss,
            pooled: &pooled,
            running: &running,
            preloaded: &preloaded,
            zygotes: &zygotes,
            clone,
            made,
        },
        &status,
    );
    eval::print(&eval_report);
    println!("\n## Against the targets of issue 18\n");
    targets(
        &bare,
        (&one_shot, &bw_runner),
        &bare_conc,
        &conc,
        (&ds, &ds_warm),
        &running,
        &eval_report,
    );
    if let Some(floor) = &floor_closed {
        closed_loop_floor(&bare, &conc[0], floor, eight_turns.as_ref());
    }
    if let Some(turns) = &eight_turns {
        throughput_against_floor(turns);
    }
    placements(args.rounds);
    Ok(())
}

/// Waits (up to 20 s) for the pool to be full: refills wait for executions to end.
fn pool_full(client: &mut Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pool = client.get("/readyz")?["pool"].clone();
        let full = pool["idle"].as_u64() >= pool["size"].as_u64() && pool["starting"] == 0;
        if full || Instant::now() > deadline {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 47's closed loop alone, `turns` times: bare starts, airlock's closed loop of
/// `requests` on one connection from a full pool, then floor.py's (which times its own bare
/// starts), each on a quiet machine; each turn's ratios and their medians.
fn closed_turns(
    server: &Server,
    client: &mut Client,
    requests: usize,
    turns: usize,
) -> Result<(), String> {
    let mut ours = (Vec::new(), Vec::new());
    let mut theirs = (Vec::new(), Vec::new());
    for turn in 1..=turns {
        settle();
        let mut bare = Series::new("bare");
        for _ in 0..40 {
            bare.samples.push(time_command(
                Command::new(PYTHON).args(["-I", "-S", "-c", "pass"]),
            )?);
        }
        pool_full(client)?;
        settle();
        let mut closed = Series::new("closed");
        let pool0 = pool_counters(client);
        let conn = std::sync::Mutex::new(server.connect()?);
        block(&mut closed, 1, requests, |_| {
            conn.lock().unwrap().execute("print(1)", None).map(drop)
        })?;
        settle();
        let floor = floor_closed_loop(requests)?;
        let base = bare.quantile(0.5).as_secs_f64();
        let (p50, p99) = (
            closed.quantile(0.5).as_secs_f64() / base,
            closed.quantile(0.99).as_secs_f64() / base,
        );
        let own = floor.bare.as_secs_f64();
        let (f50, f99) = (floor.p50.as_secs_f64() / own, floor.p99.as_secs_f64() / own);
        println!(
            "turn {turn}: bare {} ms; airlock p50 {} ms, p99 {} ms ({p50:.2} x, {p99:.2} x), {:.0}/s; floor.py p50 {} ms, p99 {} ms ({f50:.2} x, {f99:.2} x its own bare starts, {} ms), {}",
            ms(bare.quantile(0.5)),
            ms(closed.quantile(0.5)),
            ms(closed.quantile(0.99)),
            closed.rate(),
            ms(floor.p50),
            ms(floor.p99),
            ms(floor.bare),
            floor_rate(&floor),
        );
        pool_said(pool0, client);
        ours.0.push(p50);
        ours.1.push(p99);
        theirs.0.push(f50);
        theirs.1.push(f99);
    }
    println!(
        "closed loop, {turns} turns of {requests}, medians: airlock p50 {:.2} x, p99 {:.2} x a bare start (target: <= 0.4 x, <= 1 x); floor.py p50 {:.2} x, p99 {:.2} x",
        median(&ours.0),
        median(&ours.1),
        median(&theirs.0),
        median(&theirs.1)
    );
    Ok(())
}

/// How a new process comes to be in its cgroup on cgroup v2, measured on this host's cgroup2
/// mount (which needs no controller for it): what a zygote's child pays to be in its own.
fn placements(rounds: usize) {
    let gap = Duration::from_millis(30);
    println!(
        "\n## cgroup v2: a new process into its cgroup
"
    );
    let mount = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            right
                .starts_with("cgroup2 ")
                .then(|| left.split(' ').nth(4).map(PathBuf::from))?
        });
    let Some(mount) = mount else {
        println!("No cgroup2 mount here.");
        return;
    };
    match airlock_sandbox::time_v2_placements(&mount, rounds, gap) {
        Ok(times) => {
            println!(
                "On {} ({rounds} rounds, interleaved, {} ms apart, as an agent's requests come), from the call until the child, which only exits, is waited for:\n",
                mount.display(),
                gap.as_millis()
            );
            println!("| how | p50 | p90 | max |\n|---|---|---|---|");
            for (how, mut samples) in times {
                samples.sort_unstable();
                let q = |f: f64| samples[((samples.len() - 1) as f64 * f) as usize];
                let what = match how {
                    airlock_sandbox::Placement::ForkAndJoin => {
                        "fork, then the child writes `0` to `cgroup.procs`"
                    }
                    airlock_sandbox::Placement::CloneInto => {
                        "`clone3` with `CLONE_INTO_CGROUP` (a zygote's child on v2)"
                    }
                    airlock_sandbox::Placement::Fork => "plain fork, staying put",
                };
                println!(
                    "| {what} | {} ms | {} ms | {} ms |",
                    ms(q(0.5)),
                    ms(q(0.9)),
                    ms(q(1.0))
                );
            }
        }
        Err(e) => println!("Not measured: {e}"),
    }
}

/// One bare `python3` with pandas and matplotlib loaded that runs `DATA_SCIENCE` each time it
/// reads a line: the code's own cost, with nothing started or loaded for it.
struct WarmPython(std::process::Child);

impl WarmPython {
    const LOOP: &'static str = "import sys\n\
import pandas, matplotlib.pyplot\n\
code = compile(sys.argv[1], '<chart>', 'exec')\n\
for _ in range(2):\n    exec(code, {'__name__': '__main__'})\n\
for line in sys.stdin:\n    exec(code, {'__name__': '__main__'})\n    \
sys.stdout.write('ok\\n')\n    sys.stdout.flush()\n";

    fn start(mpl_dir: &std::path::Path) -> Result<WarmPython, String> {
        Command::new(PYTHON)
            .args([
                "-c",
                Self::LOOP,
                &DATA_SCIENCE.replace("/tmp/chart.png", "/dev/null"),
            ])
            .env("MPLBACKEND", "Agg")
            .env("MPLCONFIGDIR", mpl_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map(WarmPython)
            .map_err(|e| format!("warm python: {e}"))
    }

    fn run(&mut self) -> Result<Duration, String> {
        let t = Instant::now();
        let stdin = self.0.stdin.as_mut().ok_or("warm python: no stdin")?;
        stdin
            .write_all(b"\n")
            .and_then(|()| stdin.flush())
            .map_err(|e| format!("warm python: {e}"))?;
        let stdout = self.0.stdout.as_mut().ok_or("warm python: no stdout")?;
        let mut byte = [0u8; 3];
        std::io::Read::read_exact(stdout, &mut byte).map_err(|e| format!("warm python: {e}"))?;
        Ok(t.elapsed())
    }
}

impl Drop for WarmPython {
    fn drop(&mut self) {
        drop(self.0.stdin.take());
        let _ = self.0.wait();
    }
}

/// Runs `total` calls of `f` on `workers` threads (worker index given) and adds every call's
/// latency and the block's wall time to `series`.
fn block(
    series: &mut Series,
    workers: usize,
    total: usize,
    f: impl Fn(usize) -> Result<(), String> + Sync,
) -> Result<(), String> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<Result<Vec<Duration>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let (next, f) = (&next, &f);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    while next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < total {
                        let t = Instant::now();
                        f(w)?;
                        mine.push(t.elapsed());
                    }
                    Ok(mine)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    series.busy += start.elapsed();
    for r in results {
        let mine = r?;
        series.done += mine.len();
        series.samples.extend(mine);
    }
    Ok(())
}

/// Each turn's rates, airlock's and floor.py's (executions a second), and floor.py's busy CPU
/// an execution (ms) where it said it.
struct Turns(Vec<(f64, f64)>, Vec<f64>);

impl Turns {
    /// airlock's rate over floor.py's: the turns' median, lowest and highest.
    fn median(&self) -> (f64, f64, f64) {
        let mut ratios: Vec<f64> = self.0.iter().map(|(ours, theirs)| ours / theirs).collect();
        ratios.sort_by(f64::total_cmp);
        match ratios.as_slice() {
            [] => (0.0, 0.0, 0.0),
            r => (r[r.len() / 2], r[0], r[r.len() - 1]),
        }
    }
}

/// airlock's load from `clients` clients and floor.py's with as many workers, `secs` each,
/// taking `turns` turns (this machine's speed drifts by a fifth within minutes), each on a
/// quiet machine: what the kernel does later for one load (network namespaces and cgroups
/// freed by its workers) is not counted in the next. airlock's server stays up, idle, while
/// floor.py runs. Needs root.
fn load_turns(
    server: &Server,
    clients: usize,
    secs: Duration,
    turns: usize,
) -> Result<Turns, String> {
    let (mut rates, mut busy) = (Vec::new(), Vec::new());
    for turn in 1..=turns.max(1) {
        let ours = load(server, clients, secs)?;
        settle();
        let FloorLoad {
            rate: theirs,
            busy_ms,
        } = floor(clients, secs, "")?;
        settle();
        rates.push((ours, theirs));
        busy.extend(busy_ms);
        println!(
            "turn {turn}: airlock {ours:.0}/s, floor.py {theirs:.0}/s: {:.2}",
            ours / theirs
        );
    }
    Ok(Turns(rates, busy))
}

/// Issue 47's throughput target against what this run reached.
fn throughput_against_floor(turns: &Turns) {
    let (median, low, high) = turns.median();
    let list = |pick: fn(&(f64, f64)) -> f64| {
        let rates: Vec<String> = turns.0.iter().map(|t| format!("{:.0}", pick(t))).collect();
        rates.join(", ")
    };
    println!("\n## Eight clients against floor.py's eight workers (issue 47)\n");
    println!("| what | target | reached |\n|---|---|---|");
    println!(
        "| HTTP `print(1)`, 8 clients, rate ÷ floor.py's with 8 workers in the same turn, median of {} turns | ≥ 0.9 | {median:.2} (from {low:.2} to {high:.2}; airlock {} /s, floor.py {} /s) |",
        turns.0.len(),
        list(|t| t.0),
        list(|t| t.1),
    );
}

/// `print(1)` from `clients` closed-loop clients for `secs`: the rate, and the machine's
/// busy CPU time per execution (all processes, from `/proc/stat`), to run under a profiler.
fn load(server: &Server, clients: usize, secs: Duration) -> Result<f64, String> {
    let mut conns = (0..clients)
        .map(|_| server.connect())
        .collect::<Result<Vec<_>, _>>()?;
    std::thread::sleep(Duration::from_secs(2));
    settle();
    let busy = || -> Result<f64, String> {
        let f = cpu_stat().ok_or("/proc/stat unreadable")?;
        // user nice system idle iowait irq softirq steal: busy is all but idle and iowait.
        let ticks = f.iter().sum::<u64>() - f.get(3).unwrap_or(&0) - f.get(4).unwrap_or(&0);
        Ok(ticks as f64
            / nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
                .ok()
                .flatten()
                .unwrap_or(100) as f64)
    };
    let pool0 = pool_counters(&mut conns[0]);
    let stop = Instant::now() + secs;
    let cpu0 = busy()?;
    let start = Instant::now();
    let done = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for c in conns.iter_mut() {
            let done = &done;
            s.spawn(move || {
                while Instant::now() < stop {
                    if c.execute("print(1)", None).is_ok() {
                        done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
    });
    let (wall, cpu) = (start.elapsed().as_secs_f64(), busy()? - cpu0);
    let n = done.into_inner();
    println!(
        "{clients} clients, {wall:.1} s: {n} executions, {:.0}/s, {:.2} ms of busy CPU each (all processes)",
        n as f64 / wall,
        cpu * 1000.0 / n.max(1) as f64
    );
    pool_said(pool0, &mut conns[0]);
    Ok(n as f64 / wall)
}

/// The pool's counters `load` reports, as `/readyz` names them.
const POOL_COUNTERS: [&str; 4] = ["takes", "waits", "misses_empty", "refills"];

/// Where the executions' sandboxes came from since `before`: taken ready, waited for, or
/// made then.
fn pool_said(before: Option<Vec<u64>>, client: &mut Client) {
    if let (Some(before), Some(after)) = (before, pool_counters(client)) {
        let said: Vec<String> = POOL_COUNTERS
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(name, (b, a))| format!("{name} {}", a.saturating_sub(*b)))
            .collect();
        println!("  the pool: {}", said.join(", "));
    }
}

fn pool_counters(client: &mut Client) -> Option<Vec<u64>> {
    let ready = client.get("/readyz").ok()?;
    POOL_COUNTERS
        .iter()
        .map(|name| ready["pool"][name].as_u64())
        .collect()
}

/// The least work a fresh sandbox can cost on this machine, measured by `floor.py` (see
/// there) with `clients` workers for `secs`, the steps in `skip` left out. Needs root.
fn floor(clients: usize, secs: Duration, skip: &str) -> Result<FloorLoad, String> {
    let out = Command::new(PYTHON)
        .args(["-I", "-S", "-c", include_str!("../floor.py")])
        .args([
            clients.to_string(),
            secs.as_secs().to_string(),
            skip.to_string(),
        ])
        .output()
        .map_err(|e| format!("{PYTHON}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "floor.py failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let said = String::from_utf8_lossy(&out.stdout);
    print!("{said}");
    parse_floor_load(&said).ok_or_else(|| format!("floor.py said no rate: {said}"))
}

/// What `floor.py WORKERS SECONDS` measured.
#[derive(Debug, PartialEq)]
struct FloorLoad {
    /// Executions a second.
    rate: f64,
    /// The machine's busy CPU an execution (all processes), in ms.
    busy_ms: Option<f64>,
}

/// floor.py's line: "floor, 8 workers, 8.0 s: 2411 executions, 301/s, 6.52 ms of busy CPU
/// each (all processes; ...": its rate and busy CPU.
fn parse_floor_load(said: &str) -> Option<FloorLoad> {
    let rate = said
        .split(", ")
        .find_map(|part| part.trim_end().strip_suffix("/s")?.parse().ok())?;
    let busy_ms = said
        .split_once(" ms of busy CPU")
        .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok());
    Some(FloorLoad { rate, busy_ms })
}

/// What `floor.py closed` measured: the p50 and p99 of its closed loop, and the p50 of the
/// bare python starts it timed around it.
#[derive(Debug, PartialEq)]
struct FloorClosed {
    p50: Duration,
    p99: Duration,
    bare: Duration,
    /// Requests a second over the whole loop, its work off the clock included.
    rate: Option<f64>,
    /// The time from one request's start to the next's, p50 and p99.
    period: Option<(Duration, Duration)>,
}

/// `floor.py closed REQUESTS` (see there): every step of a fresh sandbox for each request of
/// one client, no server. Needs root.
fn floor_closed_loop(requests: usize) -> Result<FloorClosed, String> {
    let out = Command::new(PYTHON)
        .args(["-I", "-S", "-c", include_str!("../floor.py")])
        .args(["closed", &requests.to_string()])
        .output()
        .map_err(|e| format!("{PYTHON}: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(format!(
            "floor.py closed failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    parse_floor_closed(&said)
        .ok_or_else(|| format!("floor.py closed said no p50, p99 and bare start: {said}"))
}

/// floor.py's closed-loop line: "floor, closed loop, 400 requests, 8 made ahead: p50 2.77 ms,
/// p99 5.50 ms; bare python 6.13 ms (p50 of 80, ...": its first three figures in ms.
fn parse_floor_closed(said: &str) -> Option<FloorClosed> {
    let figures: Vec<f64> = said
        .split(" ms")
        .filter_map(|part| part.rsplit(' ').next()?.parse().ok())
        .collect();
    let rate = said
        .split_once("/s")
        .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok());
    let ms = |m: f64| Duration::from_secs_f64(m / 1000.0);
    match figures[..] {
        [p50, p99, bare, ref more @ ..] => Some(FloorClosed {
            p50: ms(p50),
            p99: ms(p99),
            bare: ms(bare),
            rate,
            period: match more {
                [p50, p99, ..] => Some((ms(*p50), ms(*p99))),
                _ => None,
            },
        }),
        _ => None,
    }
}

/// Issue 47's closed-loop targets (p50 ≤ 0.4 ×, p99 ≤ 1 × a bare python start) beside the
/// least the machine allows with a sandbox's steps: floor.py's closed loop in the same run.
fn closed_loop_floor(bare: &Series, closed: &Series, floor: &FloorClosed, eight: Option<&Turns>) {
    let base = bare.quantile(0.5).as_secs_f64();
    let ratio = |d: Duration| d.as_secs_f64() / base;
    let own = |d: Duration| d.as_secs_f64() / floor.bare.as_secs_f64();
    println!("\n## The closed loop against its floor (issue 47)\n");
    println!(
        "| closed loop, one client, `print(1)` | p50 ms | p99 ms | p50 ÷ bare | p99 ÷ bare p50 |"
    );
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| airlock, HTTP (target: ≤ 0.4 × / ≤ 1 ×) | {} | {} | {:.2} | {:.2} |",
        ms(closed.quantile(0.5)),
        ms(closed.quantile(0.99)),
        ratio(closed.quantile(0.5)),
        ratio(closed.quantile(0.99))
    );
    println!(
        "| `floor.py closed`: a sandbox's steps and nothing else, no server | {} | {} | {:.2} | {:.2} |",
        ms(floor.p50),
        ms(floor.p99),
        ratio(floor.p50),
        ratio(floor.p99)
    );
    println!(
        "\nfloor.py's own bare starts, timed around its loop: {} ms (its p50 {:.2} ×, p99 {:.2} × those). airlock's closed loop is {:.2} × floor.py's at the p50 and {:.2} × at the p99. The loops' rates: airlock {:.0}/s, floor.py {}.",
        ms(floor.bare),
        own(floor.p50),
        own(floor.p99),
        closed.quantile(0.5).as_secs_f64() / floor.p50.as_secs_f64(),
        closed.quantile(0.99).as_secs_f64() / floor.p99.as_secs_f64(),
        closed.rate(),
        floor_rate(floor),
    );
    if let Some(least) = eight.and_then(|t| closed_loop_bound(&t.1, base)) {
        println!(
            "\nOne client back to back needs a sandbox made and one torn down for each request: on {} cores at least the busy CPU of an execution ÷ {} between two requests, on average. floor.py's eight workers in this run: {:.2} ms of busy CPU an execution (median of {} turns), so at least {:.2} ms a request, {:.2} × this run's bare start (the p50 target: 0.4 ×). airlock's closed loop: a request every {:.2} ms on average.",
            least.cores,
            least.cores,
            least.busy_ms,
            eight.map_or(0, |t| t.1.len()),
            least.period_ms,
            least.of_bare,
            1000.0 / closed.rate(),
        );
    }
}

/// The least mean time between two requests of one client back to back, each needing a
/// sandbox made and one torn down, on this machine's cores: the median busy CPU an execution
/// that floor.py measured, over the cores; `base` a bare start (s).
#[derive(Debug, PartialEq)]
struct Bound {
    cores: usize,
    busy_ms: f64,
    period_ms: f64,
    of_bare: f64,
}

fn closed_loop_bound(busy_ms: &[f64], base: f64) -> Option<Bound> {
    let mut busy = busy_ms.to_vec();
    busy.sort_by(f64::total_cmp);
    let busy_ms = *busy.get(busy.len() / 2)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let period_ms = busy_ms / cores as f64;
    Some(Bound {
        cores,
        busy_ms,
        period_ms,
        of_bare: period_ms / (base * 1000.0),
    })
}

/// floor.py's closed loop's own rate, its work off the clock included (it forks each
/// replacement, and removes each cgroup, between two requests).
fn floor_rate(floor: &FloorClosed) -> String {
    let rate = floor.rate.map_or("(not said)".into(), |r| {
        format!("{r:.0}/s with the replacements' forks and cgroups between requests")
    });
    match floor.period {
        Some((p50, p99)) => format!(
            "{rate}, a request every p50 {} ms, p99 {} ms ({:.2} x, {:.2} x its bare starts)",
            ms(p50),
            ms(p99),
            p50.as_secs_f64() / floor.bare.as_secs_f64(),
            p99.as_secs_f64() / floor.bare.as_secs_f64()
        ),
        None => rate,
    }
}

/// Memory figures, and how long a zygote takes to make a sandbox.
struct Memory<'a> {
    idle_rss_kib: u64,
    /// PSS of each idle pooled lean sandbox (all its processes).
    pooled: &'a [u64],
    /// PSS of sandboxes that have run `print(1)` and wait (all their processes).
    running: &'a [u64],
    /// PSS and USS of each idle pooled child of the preloading zygote.
    preloaded: &'a [(u64, u64)],
    /// PSS of each zygote (its template's processes).
    zygotes: &'a [u64],
    /// Mean time from asking a zygote for a child to the child confined and about to run.
    clone: Option<Duration>,
    /// Mean time to make a sandbox on the spot, and how many, over the concurrency series.
    made: Option<(Duration, u64)>,
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn median_max(v: &[u64]) -> Option<(u64, u64)> {
    let mut v = v.to_vec();
    v.sort();
    Some((*v.get(v.len() / 2)?, *v.last()?))
}

#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    bare: &Series,
    single: &[&Series],
    bare_conc: &Series,
    conc: &[Series],
    cell_conc: &[Series],
    code: &[Series],
    out: &[Series],
    data_science: &[&Series],
    memory: Memory<'_>,
    status: &serde_json::Value,
) {
    let base = bare.quantile(0.5);
    let ratio = |d: Duration| d.as_secs_f64() / base.as_secs_f64();
    println!("## Machine\n");
    println!("{}", machine());
    println!(
        "Command: `airlock-bench --rounds {} --requests {} --blocks {}`; server with its default configuration.\n",
        args.rounds, args.requests, args.blocks
    );
    println!("## Start-up, interleaved ({} rounds)\n", args.rounds);
    table_head();
    for s in single.iter().filter(|s| !s.samples.is_empty()) {
        row(s, ratio(s.quantile(0.5)), ratio(s.quantile(0.99)));
    }
    println!(
        "\n## Throughput and latency under concurrency ({} blocks of {} each)\n",
        args.blocks, args.requests
    );
    println!("Each client sends its next request as soon as it has the answer to the last, on one kept-alive connection: \"1 at once\" is the closed loop back to back.\n");
    if let Some(stolen) = STOLEN.get() {
        println!("CPU time the hypervisor took from this machine during these blocks (steal, `/proc/stat`): {stolen:.2} %. A run with more than a few tenths of a percent was disturbed.\n");
    }
    table_head();
    row(
        bare_conc,
        ratio(bare_conc.quantile(0.5)),
        ratio(bare_conc.quantile(0.99)),
    );
    for s in conc.iter().chain(cell_conc) {
        row(s, ratio(s.quantile(0.5)), ratio(s.quantile(0.99)));
    }
    println!("\n## Cost curve: code size and output size (HTTP, sequential)\n");
    table_head();
    for s in code.iter().chain(out) {
        row(s, ratio(s.quantile(0.5)), ratio(s.quantile(0.99)));
    }
    println!("\n## Data science: import pandas and matplotlib, draw a chart, save a PNG\n");
    table_head();
    for s in data_science {
        row(s, ratio(s.quantile(0.5)), ratio(s.quantile(0.99)));
    }
    println!("\n## Memory and zygotes\n");
    println!(
        "- idle server (pool full, after warm-up), RSS: {:.1} MiB",
        mib(memory.idle_rss_kib)
    );
    match median_max(memory.pooled) {
        Some((median, max)) => println!(
            "- idle pooled sandbox (all its processes; a lean zygote's child when one is ready), PSS: median {:.1} MiB, max {:.1} MiB, over {} sandboxes",
            mib(median),
            mib(max),
            memory.pooled.len()
        ),
        None => println!("- no idle pooled sandbox was found"),
    }
    if let Some((median, max)) = median_max(memory.running) {
        println!(
            "- a sandbox that has run `print(1)` (all its processes, measured while it sleeps after it), PSS: median {:.1} MiB, max {:.1} MiB, over {}",
            mib(median),
            mib(max),
            memory.running.len()
        );
    }
    for (pss, uss) in memory.preloaded {
        println!(
            "- idle pooled child of the preloading zygote: PSS {:.1} MiB (the zygote's pages split between it and the zygote alone), of its own (USS) {:.1} MiB",
            mib(*pss),
            mib(*uss)
        );
    }
    match median_max(memory.zygotes) {
        Some((median, max)) => println!(
            "- zygotes (their templates' processes), PSS: median {:.1} MiB, max {:.1} MiB, over {} zygotes",
            mib(median),
            mib(max),
            memory.zygotes.len()
        ),
        None => println!("- no zygote was found"),
    }
    if let Some((made, n)) = memory.made {
        println!(
            "- a lean zygote's child made on the spot, from the request to the program confined (jail, fork, confinement; executions of the concurrency series that found the pool empty, mean over {n}): {} ms",
            ms(made)
        );
    }
    if let Some(clone) = memory.clone {
        println!(
            "- the data-science series' sandboxes, from the request to the program ready (a pooled child of the preloading zygote when one is ready; mean): {} ms",
            ms(clone)
        );
    }
    println!("- pool at the end: `{}`", status["pool"]);
    println!("- zygotes at the end: `{}`", status["zygote"]);
    let cell_best = cell_conc.iter().map(Series::rate).fold(0.0, f64::max);
    println!(
        "\nFor comparison, a cell in a session (no new sandbox: the same interpreter): p50 {:.2} ×, p99 {:.2} × bare python, {cell_best:.0}/s at best.",
        ratio(single[4].quantile(0.5)),
        ratio(single[4].quantile(0.99)),
    );
}

/// The targets of issue 18, each with what this run reached.
/// `cold`: `airlock run` one-shot, and bwrap with the runner's own start (its floor).
fn targets(
    bare: &Series,
    cold: (&Series, &Series),
    bare_conc: &Series,
    conc: &[Series],
    data_science: (&Series, &Series),
    running: &[u64],
    eval: &eval::EvalReport,
) {
    let (data_science, warm) = data_science;
    let base = bare.quantile(0.5).as_secs_f64();
    let ratio = |d: Duration| d.as_secs_f64() / base;
    let (one_shot, bw_runner) = cold;
    let closed = &conc[0];
    let eight = &conc[conc.len() - 1];
    println!("| what | target | reached |\n|---|---|---|");
    println!(
        "| HTTP `print(1)`, closed loop back-to-back on one connection, p50 / p99 | ≤ 0.3 × / ≤ 1 × | {:.2} × / {:.2} × |",
        ratio(closed.quantile(0.5)),
        ratio(closed.quantile(0.99))
    );
    println!(
        "| fresh-sandbox throughput, 8 clients | ≥ 400/s and ≥ 1.5 × bare python starts | {:.0}/s, {:.2} × bare python starts ({:.0}/s) |",
        eight.rate(),
        eight.rate() / bare_conc.rate(),
        bare_conc.rate()
    );
    println!(
        "| fresh sandbox: import pandas + matplotlib, plot, save PNG, p50 | ≤ 60 ms | {} ms, {:.2} × bare (the same code run again in a warm `python3`, no sandbox: {} ms) |",
        ms(data_science.quantile(0.5)),
        ratio(data_science.quantile(0.5)),
        ms(warm.quantile(0.5))
    );
    println!(
        "| `airlock run` one-shot (cold) | ≤ 2 × | {:.2} × (`bwrap` + the runner's own start, no cgroup, Landlock or seccomp: {:.2} ×) |",
        ratio(one_shot.quantile(0.5)),
        ratio(bw_runner.quantile(0.5))
    );
    if let Some((median, max)) = median_max(running) {
        println!(
            "| per-child memory for `print(1)` (PSS, the zygote's pages shared) | ≤ 4 MiB | median {:.1} MiB, max {:.1} MiB (a sandbox that has run it, all its processes) |",
            mib(median),
            mib(max)
        );
    }
    println!(
        "| `airlock eval --json` batch, per expression | ≤ 2.5 µs | {:.2} µs ({:.2} µs of CPU) |",
        eval.batch.quantile(0.5).as_secs_f64() * 1e6,
        eval.batch_cpu.quantile(0.5).as_secs_f64() * 1e6
    );
}

fn table_head() {
    println!("| series | n | p50 ms | p99 ms | per second | p50 ÷ bare | p99 ÷ bare p50 |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
}

fn row(s: &Series, r50: f64, r99: f64) {
    println!(
        "| {} | {} | {} | {} | {:.0} | {:.2} | {:.2} |",
        s.name,
        s.samples.len(),
        ms(s.quantile(0.5)),
        ms(s.quantile(0.99)),
        s.rate(),
        r50,
        r99
    );
}

/// Steal during the concurrency blocks, in percent of all CPU time (see [`cpu_ticks`]).
static STOLEN: std::sync::OnceLock<f64> = std::sync::OnceLock::new();

/// The machine's CPU ticks so far, from `/proc/stat`'s first line: user, nice, system, idle,
/// iowait, irq, softirq, steal.
fn cpu_stat() -> Option<Vec<u64>> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    Some(
        stat.lines()
            .next()?
            .split_whitespace()
            .skip(1)
            .take(8)
            .filter_map(|v| v.parse().ok())
            .collect(),
    )
}

/// Waits (up to 20 s) until the machine is quiet: at most 2 % of its CPU busy over 300 ms, so
/// that work the kernel deferred from one load (network namespaces and cgroups freed by its
/// workers) is not counted in the next.
fn settle() {
    let busy_share = || -> Option<f64> {
        let before = cpu_stat()?;
        std::thread::sleep(Duration::from_millis(300));
        let after = cpu_stat()?;
        let d: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        let total: u64 = d.iter().sum();
        let idle = d.get(3).unwrap_or(&0) + d.get(4).unwrap_or(&0);
        Some((total - idle) as f64 / total.max(1) as f64)
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        match busy_share() {
            Some(share) if share > 0.02 => continue,
            _ => return,
        }
    }
}

/// All CPU ticks so far and those stolen by the hypervisor.
fn cpu_ticks() -> Option<(u64, u64)> {
    let f = cpu_stat()?;
    Some((f.iter().sum(), *f.get(7)?))
}

fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("unknown")
        .trim()
        .to_owned();
    let mem = read("/proc/meminfo")
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .nth(1)
        .and_then(|k| k.parse::<u64>().ok())
        .map_or("?".into(), |k| format!("{:.1} GiB", k as f64 / 1048576.0));
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let python = Command::new(PYTHON)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let bwrap = Command::new("bwrap")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "not installed".into());
    let cgroup = if Path::new("/sys/fs/cgroup/memory").is_dir() {
        "v1"
    } else {
        "v2"
    };
    format!(
        "- CPU: {cpu}, {} cores; memory {mem}\n- kernel {kernel}, cgroup {cgroup}\n- {python} ({PYTHON}); {bwrap}\n",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    )
}

/// `bwrap` with every namespace, a read-only `/usr` and fresh `/proc`, `/dev` and `/tmp`.
const BWRAP_ARGS: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--symlink",
    "usr/bin",
    "/bin",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
];

/// Time from spawn to exit; fails unless it exits 0.
fn time_command(cmd: &mut Command) -> Result<Duration, String> {
    time_command_with(cmd, None)
}

/// The same, writing `input` to its standard input.
fn time_command_with(cmd: &mut Command, input: Option<&[u8]>) -> Result<Duration, String> {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let t = Instant::now();
    let mut child = cmd.spawn().map_err(|e| format!("{cmd:?}: {e}"))?;
    if let Some(bytes) = input {
        let mut stdin = child.stdin.take().ok_or("no stdin")?;
        stdin
            .write_all(bytes)
            .map_err(|e| format!("{cmd:?}: stdin: {e}"))?;
    }
    let status = child.wait().map_err(|e| format!("{cmd:?}: {e}"))?;
    let took = t.elapsed();
    if !status.success() {
        return Err(format!("{cmd:?} failed: {status}"));
    }
    Ok(took)
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

fn size(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else {
        format!("{} KiB", n >> 10)
    }
}

/// `print(1)` after comment lines, `n` bytes in all.
fn padded_code(n: usize) -> String {
    let line = format!("# {}\n", "x".repeat(77));
    let mut code = String::with_capacity(n);
    while code.len() + line.len() + 9 <= n {
        code.push_str(&line);
    }
    code.push_str("print(1)\n");
    code
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(airlock: &Path, state: &Path) -> Result<Server, String> {
        Self::start_with(airlock, state, &[])
    }

    /// As `start`, with more settings in the environment (`AIRLOCK_...`).
    fn start_with(airlock: &Path, state: &Path, env: &[(&str, &str)]) -> Result<Server, String> {
        let mut child = Command::new(airlock)
            .args(["serve", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(state)
            .env("AIRLOCK_API_KEY", KEY)
            // One session per client at the highest concurrency level.
            .env("AIRLOCK_SESSIONS__MAX_OPEN_PER_KEY", "8")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("starting airlock serve: {e}"))?;
        let mut lines = BufReader::new(child.stderr.take().ok_or("no stderr")?).lines();
        let addr = loop {
            let line = match lines.next() {
                Some(Ok(l)) => l,
                _ => return Err("airlock serve exited before listening".into()),
            };
            if let Some(rest) = line.split("listening on http://").nth(1) {
                break rest.trim().parse().map_err(|e| format!("{rest}: {e}"))?;
            }
        };
        // Keep draining its log so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Server { child, addr })
    }

    fn connect(&self) -> Result<Client, String> {
        let stream = TcpStream::connect(self.addr).map_err(|e| format!("connect: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        Ok(Client {
            addr: self.addr,
            stream: BufReader::new(stream),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A keep-alive HTTP/1.1 client, just enough for the API. It reconnects when the server has
/// closed an idle connection.
struct Client {
    addr: SocketAddr,
    stream: BufReader<TcpStream>,
}

impl Client {
    fn execute(
        &mut self,
        code: &str,
        output_bytes: Option<usize>,
    ) -> Result<serde_json::Value, String> {
        let mut body = serde_json::json!({"code": code});
        if let Some(n) = output_bytes {
            body["limits"] = serde_json::json!({"output_bytes": n});
        }
        self.post("/v1/execute", &body, 200)
    }

    /// A new session's id.
    fn session(&mut self) -> Result<String, String> {
        let v = self.post("/v1/sessions", &serde_json::json!({}), 201)?;
        v["id"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| format!("no session id in {v}"))
    }

    /// One cell in session `id`.
    fn cell(&mut self, id: &str, code: &str) -> Result<serde_json::Value, String> {
        let body = serde_json::json!({"code": code});
        let v = self.post(&format!("/v1/sessions/{id}/execute"), &body, 200)?;
        if v["status"] != "ok" {
            return Err(format!("cell failed: {v}"));
        }
        Ok(v)
    }

    fn post(
        &mut self,
        path: &str,
        body: &serde_json::Value,
        want: u16,
    ) -> Result<serde_json::Value, String> {
        let body = body.to_string();
        let head = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let (status, text) = self.call(head.as_bytes(), body.as_bytes())?;
        let v: serde_json::Value = serde_json::from_slice(&text).map_err(|e| format!("{e}"))?;
        if status != want || (want == 200 && v["status"] != "ok") {
            return Err(format!("{path} failed: {status} {v}"));
        }
        Ok(v)
    }

    fn delete(&mut self, path: &str) -> Result<(), String> {
        let head = format!(
            "DELETE {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n"
        );
        match self.call(head.as_bytes(), b"")? {
            (204, _) => Ok(()),
            (status, body) => Err(format!(
                "DELETE {path}: {status} {}",
                String::from_utf8_lossy(&body)
            )),
        }
    }

    fn get(&mut self, path: &str) -> Result<serde_json::Value, String> {
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n"
        );
        let (_, text) = self.call(head.as_bytes(), b"")?;
        serde_json::from_slice(&text).map_err(|e| format!("{e}"))
    }

    fn call(&mut self, head: &[u8], body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        match self.call_once(head, body) {
            Err(e) if e.starts_with("send") || e == "connection closed" => {
                let stream = TcpStream::connect(self.addr).map_err(|e| format!("connect: {e}"))?;
                stream.set_nodelay(true).map_err(|e| e.to_string())?;
                self.stream = BufReader::new(stream);
                self.call_once(head, body)
            }
            other => other,
        }
    }

    fn call_once(&mut self, head: &[u8], body: &[u8]) -> Result<(u16, Vec<u8>), String> {
        let s = self.stream.get_mut();
        s.write_all(head)
            .and_then(|_| s.write_all(body))
            .map_err(|e| format!("send: {e}"))?;
        let mut status = 0;
        let mut length = 0usize;
        loop {
            let mut line = String::new();
            self.stream
                .read_line(&mut line)
                .map_err(|e| format!("read: {e}"))?;
            if line.is_empty() {
                return Err("connection closed".into());
            }
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            if let Some(rest) = line.strip_prefix("HTTP/1.1 ") {
                status = rest.get(..3).and_then(|c| c.parse().ok()).unwrap_or(0);
            } else if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    length = v.trim().parse().map_err(|e| format!("{e}"))?;
                }
            }
        }
        let mut text = vec![0; length];
        self.stream
            .read_exact(&mut text)
            .map_err(|e| format!("read body: {e}"))?;
        Ok((status, text))
    }
}

fn rss_kib(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn pss_kib(pid: u32) -> u64 {
    rollup_kib(pid, &["Pss:"])
}

/// Memory no other process shares (USS): what one more such process costs.
fn uss_kib(pid: u32) -> u64 {
    rollup_kib(pid, &["Private_Clean:", "Private_Dirty:"])
}

fn rollup_kib(pid: u32, fields: &[&str]) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .unwrap_or_default()
        .lines()
        .filter(|l| fields.iter().any(|f| l.starts_with(f)))
        .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// Whether a process has pandas loaded (a child of the preloading zygote).
fn maps_pandas(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| m.contains("/pandas/"))
}

/// PSS of each sandbox of the server `server` that holds processes, from its cgroups
/// (`airlock-<pid>-<n>`): the zygotes' templates (`airlock-<pid>-zygote-<n>`) when `zygotes`,
/// the other sandboxes otherwise: (PSS, USS, pandas loaded, a process sleeping in
/// `nanosleep`), each in KiB.
fn sandbox_pss(server: u32, zygotes: bool) -> Vec<(u64, u64, bool, bool)> {
    let prefix = format!("airlock-{server}-");
    let mut seen = std::collections::BTreeMap::<String, (u64, u64, bool, bool)>::new();
    let mut dirs = vec![(PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) {
                if depth < 6 {
                    dirs.push((e.path(), depth + 1));
                }
                continue;
            }
            if name.contains("-zygote-") != zygotes || seen.contains_key(&name) {
                continue;
            }
            let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<u32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            let pss: u64 = pids.iter().copied().map(pss_kib).sum();
            let uss: u64 = pids.iter().copied().map(uss_kib).sum();
            let sleeping = pids.iter().any(|p| {
                std::fs::read_to_string(format!("/proc/{p}/wchan"))
                    .is_ok_and(|w| w.contains("nanosleep"))
            });
            if pss > 0 {
                let pandas = pids.iter().copied().any(maps_pandas);
                seen.insert(name, (pss, uss, pandas, sleeping));
            }
        }
    }
    seen.into_values().collect()
}

/// The PSS of `n` sandboxes, one at a time, each measured while its code sleeps after
/// `print(1)` (what a child running `print(1)` holds, where an idle pooled child has not yet
/// written what an execution writes).
fn running_pss(server: &Server, n: usize) -> Result<Vec<u64>, String> {
    const CODE: &str = "print(1)\nimport time\ntime.sleep(1.5)\n";
    let mut found = Vec::new();
    for _ in 0..n {
        let mut client = server.connect()?;
        let running = std::thread::spawn(move || client.execute(CODE, None).map(|_| ()));
        std::thread::sleep(Duration::from_millis(800));
        let sleeping: Vec<u64> = sandbox_pss(server.child.id(), false)
            .iter()
            .filter(|s| s.3)
            .map(|s| s.0)
            .collect();
        running.join().map_err(|_| "the client panicked")??;
        if let [one] = sleeping[..] {
            found.push(one);
        }
    }
    Ok(found)
}

/// Waits until no zygote is starting and the preloaded pool is full (at most a minute; a host
/// without zygotes has none).
fn wait_zygotes(client: &mut Client) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let ready = client.get("/readyz")?;
        let (z, preloaded) = (&ready["zygote"], &ready["pool_preloaded"]);
        // And the pooled child of the preloading zygote in place (it copies the pages a
        // first chart writes before it says it is ready).
        let pooled = preloaded.is_null()
            || (preloaded["idle"].as_u64() >= preloaded["size"].as_u64()
                && preloaded["starting"] == 0);
        if z.is_null() || (z["starting"] == 0 && pooled) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// `(sum, count)` of a histogram of `/metrics`.
fn histogram(client: &mut Client, name: &str) -> Result<(f64, u64), String> {
    let text = metrics_text(client)?;
    let value = |suffix: &str| series(&text, &format!("{name}{suffix}")).unwrap_or(0.0);
    Ok((value("_sum"), value("_count") as u64))
}

/// The server's `/metrics`, as text.
fn metrics_text(client: &mut Client) -> Result<String, String> {
    let head =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    let (_, body) = client.call(head.as_bytes(), b"")?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The value of series `name` (labels included, if it has any) in `/metrics` text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The middle value of `v` (0 for none).
fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_py_s_closed_loop_line_gives_its_p50_p99_and_bare_start() {
        let said = "floor, closed loop, 400 requests, 8 made ahead: p50 2.77 ms, p99 5.50 ms; \
                    bare python 6.13 ms (p50 of 80, before and after): p50 0.45 x, p99 0.90 x\n";
        let ms = |m: f64| Duration::from_secs_f64(m / 1000.0);
        assert_eq!(
            parse_floor_closed(said),
            Some(FloorClosed {
                p50: ms(2.77),
                p99: ms(5.50),
                bare: ms(6.13),
                rate: None,
                period: None,
            })
        );
        let said = "floor, closed loop, 400 requests, 8 made ahead: p50 5.30 ms, p99 9.96 ms; \
                    bare python 13.29 ms (p50 of 80, before and after): p50 0.40 x, p99 0.75 x; \
                    the loop, the work off the clock included, 131/s, a request every p50 \
                    7.62 ms, p99 12.40 ms\n";
        assert_eq!(
            parse_floor_closed(said),
            Some(FloorClosed {
                p50: ms(5.30),
                p99: ms(9.96),
                bare: ms(13.29),
                rate: Some(131.0),
                period: Some((ms(7.62), ms(12.40))),
            })
        );
        assert_eq!(parse_floor_closed("floor.py: needs root\n"), None);
    }

    #[test]
    fn floor_py_s_load_line_gives_its_rate_and_busy_cpu() {
        let said = "floor, 8 workers, 10.0 s: 2411 executions, 241/s, 8.61 ms of busy CPU each \
                    (all processes; user 1.55, system 7.06), 600 page faults each (the forks)\n";
        assert_eq!(
            parse_floor_load(said),
            Some(FloorLoad {
                rate: 241.0,
                busy_ms: Some(8.61),
            })
        );
        let bare = "floor, 8 workers, 8.0 s: 2411 executions, 301/s\n";
        assert_eq!(
            parse_floor_load(bare),
            Some(FloorLoad {
                rate: 301.0,
                busy_ms: None,
            })
        );
        assert_eq!(parse_floor_load("floor: 2 workers failed\n"), None);
    }

    #[test]
    fn the_closed_loop_s_bound_is_the_median_busy_cpu_over_the_cores() {
        let cores = std::thread::available_parallelism().map_or(1, usize::from) as f64;
        let b = closed_loop_bound(&[9.0, 8.0, 12.0], 0.010).unwrap();
        assert_eq!(b.busy_ms, 9.0);
        assert!((b.period_ms - 9.0 / cores).abs() < 1e-9);
        assert!((b.of_bare - 9.0 / cores / 10.0).abs() < 1e-9);
        assert_eq!(closed_loop_bound(&[], 0.010), None);
    }
}
