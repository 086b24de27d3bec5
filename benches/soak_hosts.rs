//! Several-hosts soak (`scripts/soak-hosts`, issue 35): three supervisors
//! with homes of their own share a directory remote and a three-member
//! etcd (on loopback); twenty agents; clients send turns that teach facts
//! to random agents on random hosts (`chat --wait-owner`), and now and then
//! release an agent, while faults land at random: a supervisor stopped
//! (SIGSTOP, for up to twice its lease, then SIGCONT), a supervisor killed
//! (SIGKILL, restarted a moment later), one etcd member killed (sometimes
//! two: no quorum for a while), restarted later — and (issue 43) a
//! supervisor killed inside the remote's ref-lock window (its `main.lock`
//! and `fence.lock` left in the remotes of the agents it owned), etcd
//! losing all its data (every member's data directory; hosts must resume
//! by themselves), and a remote `main` rolled back behind the owners'
//! backs (refused by every sync until an operator restores it).
//!
//! Checked, and counted in the closing figures:
//! * every fact whose turn was acknowledged (exit 0, the mock naming its
//!   commit) is in its agent's remote `main` at the end: none lost;
//! * the remote `main` of every agent only ever moved forward (sampled all
//!   along, and every sample is in the final history): none forced or
//!   diverged;
//! * at most one owner of an agent at any instant, from the audit of owner
//!   changes: in etcd's own history (each incarnation's, read before it was
//!   wiped, its epoch base with it) every owner key is created only while
//!   absent (never two owners at one revision); each host's audit log
//!   (chain verified) records taking only epochs etcd gave that host, and
//!   over all hosts each agent's ownerships, in epoch order, end before the
//!   next begins (`owner` records' `at_ms`); and along each remote's fence chain
//!   the epochs never go back — no push of a host after it lost the agent
//!   to a newer owner landed — and each fence commit was pushed by the
//!   host etcd gave its epoch to.
//!
//! Bounded: `--seconds S` (default 120) of load; `--agents N` (20),
//! `--clients K` (4), `--seed X`. Needs root (agent uids) and etcd. Exits
//! 1 on any violation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::etcd::Etcd;
use common::rng::Rng;
use git2::{Oid, Repository};
use mini_letta::memfs::fence::{self, FENCE_REF, Stamp};

const HOSTS: usize = 3;
const LEASE_SECS: u64 = 3;
/// How long a client waits for its turn before it gives up (and goes away).
const TURN_DEADLINE: Duration = Duration::from_secs(30);
/// How long a turn waits for another owner.
const WAIT_OWNER: &str = "6";

struct Args {
    seconds: u64,
    agents: usize,
    clients: usize,
    seed: u64,
}

fn args() -> Args {
    let mut a = Args {
        seconds: 120,
        agents: 20,
        clients: 4,
        seed: 0x5eed_c1a5,
    };
    let argv: Vec<String> = std::env::args().collect();
    let mut i = 1;
    while i < argv.len() {
        let value = argv.get(i + 1).and_then(|v| v.parse::<u64>().ok());
        match (argv[i].as_str(), value) {
            ("--seconds", Some(v)) => a.seconds = v,
            ("--agents", Some(v)) => a.agents = v.max(1) as usize,
            ("--clients", Some(v)) => a.clients = v.max(1) as usize,
            ("--seed", Some(v)) => a.seed = v.max(1),
            _ => {
                i += 1;
                continue;
            }
        }
        i += 2;
    }
    a
}

/// The hosts, the remote and etcd.
struct World {
    etcd: Mutex<Etcd>,
    endpoints: String,
    root: tempfile::TempDir,
    homes: Vec<tempfile::TempDir>,
    /// Supervisor pid per host (`None` while killed).
    pids: Mutex<Vec<Option<u32>>>,
    /// Hosts whose supervisor is stopped right now.
    stopped: Mutex<Vec<bool>>,
    /// (name, id) of each agent.
    agents: Vec<(String, String)>,
    /// etcd's owner histories before each wipe, with their epoch bases.
    past: Mutex<Vec<Incarnation>>,
    /// Commits a remote `main` was rolled back to by a fault: a sample of
    /// one is the fault's, not a forced push.
    rolled_back: Mutex<std::collections::HashSet<Oid>>,
}

/// One life of etcd between wipes: its owner history and its epoch base
/// (fence epochs are the base plus a take's revision).
struct Incarnation {
    base: i64,
    history: History,
    /// The revision the history was read up to.
    head: i64,
}

/// Whether fence epoch `epoch` was given by an etcd incarnation after its
/// history was read and before it was wiped (a take in that moment): no
/// history has it, and it is counted apart, not judged.
fn unobserved(incarnations: &[Incarnation], epoch: i64) -> bool {
    incarnations
        .windows(2)
        .any(|w| w[0].base + w[0].head < epoch && epoch < w[1].base)
}

/// etcd's owner-key events: `(key, put, value, revision, create revision)`.
type History = Vec<(String, bool, String, i64, i64)>;

fn host_id(h: usize) -> String {
    format!("soak-host-{h}")
}

impl World {
    fn command(&self, h: usize, args: &[&str]) -> Command {
        let mut c = Command::new(common::bin());
        c.args(args)
            .env("MINI_LETTA_HOME", self.homes[h].path())
            .env("MINI_LETTA_REMOTE_ROOT", self.root.path())
            .env("MINI_LETTA_ETCD", &self.endpoints)
            .env("MINI_LETTA_HOST_ID", host_id(h))
            .env("MINI_LETTA_LEASE_SECS", LEASE_SECS.to_string())
            .env("RUST_LOG", "mini_letta=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Run a command on host `h`, killed at `deadline` (a supervisor that
    /// is stopped never answers).
    fn run(&self, h: usize, args: &[&str], deadline: Duration) -> Output {
        let mut child = self.command(h, args).spawn().unwrap();
        let end = Instant::now() + deadline;
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > end {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().unwrap()
    }

    /// Start host `h`'s supervisor. While it was down, a client may have
    /// run one embedded (a one-shot command does): the start is tried again
    /// until that one is gone and the daemon answers.
    fn start_supervisor(&self, h: usize) {
        let home = mini_letta::paths::Home::at(self.homes[h].path());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let o = self.run(h, &["supervisor", "start"], Duration::from_secs(60));
            let answered = mini_letta::supervisor::connect(&home).ok();
            match answered {
                Some(c) if o.status.success() => {
                    self.pids.lock().unwrap()[h] = Some(c.server_pid);
                    return;
                }
                _ if Instant::now() > deadline => panic!(
                    "host {h}: the supervisor does not start: {}",
                    String::from_utf8_lossy(&o.stderr)
                ),
                _ => std::thread::sleep(Duration::from_millis(300)),
            }
        }
    }

    fn bare(&self, id: &str) -> PathBuf {
        self.root.path().join(format!("{id}.git"))
    }
}

fn signal(pid: u32, sig: nix::sys::signal::Signal) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
}

/// What happened, for the closing figures.
#[derive(Default)]
struct Tally {
    turns: u64,
    acknowledged: u64,
    refused_owner: u64,
    refused_etcd: u64,
    not_acknowledged: u64,
    gave_up: u64,
    failed: BTreeMap<String, u64>,
    releases: u64,
    /// Asked of a host that did not own the agent (or etcd was down).
    releases_refused: u64,
    faults: BTreeMap<&'static str, u64>,
}

fn main() -> ExitCode {
    let a = args();
    if !common::confinement_or_skip("soak-hosts") {
        return ExitCode::SUCCESS;
    }
    let Some(etcd) = Etcd::start("soak-hosts") else {
        return ExitCode::SUCCESS;
    };
    let world = Arc::new(setup(etcd, a.agents));
    let acked: Arc<Mutex<Vec<Vec<String>>>> = Arc::new(Mutex::new(vec![Vec::new(); a.agents]));
    let tally = Arc::new(Mutex::new(Tally::default()));
    seed_agents(&world, &acked, &tally);

    let done = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(HashMap::<String, Vec<Oid>>::new()));
    let monitor = {
        let (w, d, s) = (world.clone(), done.clone(), samples.clone());
        std::thread::spawn(move || sample_remotes(&w, &d, &s))
    };
    let clients: Vec<_> = (0..a.clients)
        .map(|c| {
            let (w, d, k, t) = (world.clone(), done.clone(), acked.clone(), tally.clone());
            let seed = a.seed.wrapping_add(c as u64 * 7919).max(1);
            std::thread::spawn(move || client(&w, &d, &k, &t, Rng(seed)))
        })
        .collect();
    let began = Instant::now();
    inject_faults(&world, &tally, Rng(a.seed), Duration::from_secs(a.seconds));
    let load_took = began.elapsed();
    done.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
    let _ = monitor.join();
    heal(&world);
    report(&world, &acked, &tally, &samples, load_took)
}

/// Homes, agents (made on host 0), supervisors.
fn setup(etcd: Etcd, agents: usize) -> World {
    let endpoints = etcd.endpoints();
    let homes: Vec<_> = (0..HOSTS).map(|_| common::open_home()).collect();
    let mut world = World {
        etcd: Mutex::new(etcd),
        endpoints,
        root: tempfile::tempdir().unwrap(),
        homes,
        pids: Mutex::new(vec![None; HOSTS]),
        stopped: Mutex::new(vec![false; HOSTS]),
        agents: Vec::new(),
        past: Mutex::new(Vec::new()),
        rolled_back: Mutex::new(Default::default()),
    };
    for i in 0..agents {
        let name = format!("soak-{i:02}");
        let o = world.run(
            0,
            &["agent", "create", &name, "--json"],
            Duration::from_secs(60),
        );
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        world
            .agents
            .push((name, v["id"].as_str().unwrap().to_string()));
    }
    for h in 0..HOSTS {
        world.start_supervisor(h);
    }
    world
}

/// One first fact per agent, taught on host 0: each agent is then on the
/// remote, and any host can clone it.
fn seed_agents(world: &World, acked: &Mutex<Vec<Vec<String>>>, tally: &Mutex<Tally>) {
    for (i, (name, _)) in world.agents.iter().enumerate() {
        let fact = format!("seed-{i}");
        let ok = turn(world, 0, name, &fact, tally);
        assert!(ok, "seeding {name} failed");
        acked.lock().unwrap()[i].push(fact);
    }
}

/// One turn teaching `fact` on host `h`; whether it was acknowledged.
fn turn(world: &World, h: usize, name: &str, fact: &str, tally: &Mutex<Tally>) -> bool {
    let text = format!("记住: {fact}");
    let o = world.run(
        h,
        &["chat", "-a", name, "--wait-owner", WAIT_OWNER, "-p", &text],
        TURN_DEADLINE,
    );
    let said = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let ok = o.status.success() && said.contains("好的，已更新记忆（提交 ");
    let mut t = tally.lock().unwrap();
    t.turns += 1;
    if ok {
        t.acknowledged += 1;
    } else if o.status.code().is_none() {
        t.gave_up += 1;
    } else if err.contains("is owned by host") {
        t.refused_owner += 1;
    } else if err.contains("etcd") {
        t.refused_etcd += 1;
    } else if err.contains("not acknowledged") {
        t.not_acknowledged += 1;
    } else {
        let why = err
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or("(no error line)")
            .split_whitespace()
            .filter(|w| !w.chars().any(|c| c.is_ascii_digit()))
            .collect::<Vec<_>>()
            .join(" ")
            .chars()
            .take(120)
            .collect::<String>();
        *t.failed.entry(why).or_default() += 1;
    }
    ok
}

/// A client: turns on random agents from random hosts, and a release now
/// and then, until `done`.
fn client(
    world: &World,
    done: &AtomicBool,
    acked: &Mutex<Vec<Vec<String>>>,
    tally: &Mutex<Tally>,
    mut rng: Rng,
) {
    let mut n = 0u64;
    while !done.load(Ordering::SeqCst) {
        let i = rng.below(world.agents.len() as u64) as usize;
        let h = rng.below(HOSTS as u64) as usize;
        let name = world.agents[i].0.clone();
        if rng.below(100) < 8 {
            let o = world.run(h, &["agent", "release", &name], Duration::from_secs(20));
            let mut t = tally.lock().unwrap();
            if o.status.success() {
                t.releases += 1;
            } else {
                t.releases_refused += 1;
            }
            continue;
        }
        n += 1;
        let fact = format!("fact-{i}-{}-{n}", rng.next() % 100_000);
        if turn(world, h, &name, &fact, tally) {
            acked.lock().unwrap()[i].push(fact);
        }
    }
}

/// What ends a fault (a SIGCONT, a restart), run when it is due.
type Undo = Box<dyn FnOnce(&World)>;

/// Faults until `within` has passed.
fn inject_faults(world: &World, tally: &Mutex<Tally>, mut rng: Rng, within: Duration) {
    let end = Instant::now() + within;
    let mut pending: Vec<(Instant, Undo)> = Vec::new();
    let mut round = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1500 + rng.below(2500)));
        let now = Instant::now();
        let (due, later): (Vec<_>, Vec<_>) = pending.into_iter().partition(|(t, _)| *t <= now);
        pending = later;
        for (_, undo) in due {
            undo(world);
        }
        let h = rng.below(HOSTS as u64) as usize;
        let pid = world.pids.lock().unwrap()[h];
        let stopped = world.stopped.lock().unwrap()[h];
        // Each kind once first (a short soak still meets every one), then
        // at random.
        const FIRST: [u64; 7] = [0, 30, 48, 58, 80, 88, 93];
        // A first-round kind that cannot land now (members down) is tried
        // again next time: `round` moves on only when a fault landed.
        let roll = FIRST.get(round).copied().unwrap_or_else(|| rng.below(100));
        let kind = match roll {
            0..30 => "supervisor SIGSTOP",
            30..48 => "supervisor SIGKILL",
            48..58 => "supervisor SIGKILL in the remote's lock window",
            58..80 => "one etcd member killed",
            80..88 => "two etcd members killed",
            88..93 => "etcd wiped",
            _ => "remote main rolled back",
        };
        let after = Duration::from_millis(1000 + rng.below(2 * LEASE_SECS * 1000));
        match (kind, pid) {
            ("supervisor SIGSTOP", Some(pid)) if !stopped => {
                signal(pid, nix::sys::signal::Signal::SIGSTOP);
                world.stopped.lock().unwrap()[h] = true;
                pending.push((
                    now + after,
                    Box::new(move |w: &World| {
                        signal(pid, nix::sys::signal::Signal::SIGCONT);
                        w.stopped.lock().unwrap()[h] = false;
                    }),
                ));
            }
            ("supervisor SIGKILL", Some(pid)) if !stopped => {
                signal(pid, nix::sys::signal::Signal::SIGKILL);
                world.pids.lock().unwrap()[h] = None;
                pending.push((
                    now + after,
                    Box::new(move |w: &World| w.start_supervisor(h)),
                ));
            }
            ("supervisor SIGKILL in the remote's lock window", Some(pid)) if !stopped => {
                signal(pid, nix::sys::signal::Signal::SIGKILL);
                world.pids.lock().unwrap()[h] = None;
                plant_locks_of(world, h);
                pending.push((
                    now + after,
                    Box::new(move |w: &World| w.start_supervisor(h)),
                ));
            }
            ("etcd wiped", _) => {
                let mut etcd = world.etcd.lock().unwrap();
                // Every member up and answering (one just restarted may not
                // listen yet): its history must be read whole first.
                if (0..3).any(|i| !etcd.is_up(i)) || !etcd.wait_healthy(Duration::from_secs(10)) {
                    continue;
                }
                let gone = incarnation(&etcd, &world.endpoints);
                world.past.lock().unwrap().push(gone);
                etcd.wipe();
            }
            ("remote main rolled back", _) => {
                let i = rng.below(world.agents.len() as u64) as usize;
                let Some(restore) = roll_back(world, &world.agents[i].1) else {
                    continue;
                };
                pending.push((now + after, restore));
            }
            ("one etcd member killed" | "two etcd members killed", _) => {
                let mut etcd = world.etcd.lock().unwrap();
                let up: Vec<usize> = (0..3).filter(|i| etcd.is_up(*i)).collect();
                if up.len() < 3 {
                    continue;
                }
                let n = if kind.starts_with("two") { 2 } else { 1 };
                let first = rng.below(3) as usize;
                for k in 0..n {
                    let m = (first + k) % 3;
                    etcd.kill(m);
                    pending.push((
                        now + after,
                        Box::new(move |w: &World| w.etcd.lock().unwrap().restart(m)),
                    ));
                }
            }
            _ => continue,
        }
        *tally.lock().unwrap().faults.entry(kind).or_default() += 1;
        round += 1;
    }
    for (_, undo) in pending {
        undo(world);
    }
}

/// A supervisor killed between locking its remotes' refs and renaming them
/// leaves the lock files: planted in the remote of every agent etcd says
/// host `h` owned, each holding the value the ref would have got.
fn plant_locks_of(world: &World, h: usize) {
    let owners: Vec<String> = {
        let etcd = world.etcd.lock().unwrap();
        world
            .agents
            .iter()
            .map(|(_, id)| etcd.get(&mini_letta::cluster::owner_key(id)))
            .collect()
    };
    for ((_, id), owner) in world.agents.iter().zip(owners) {
        if owner != host_id(h) {
            continue;
        }
        for name in ["refs/heads/main", FENCE_REF] {
            if let Some(tip) = remote_ref(world, id, name) {
                let lock = world.bare(id).join(format!("{name}.lock"));
                let _ = std::fs::write(lock, format!("{tip}\n"));
            }
        }
    }
}

/// etcd's owner history and epoch base now (before a wipe, or at the end).
fn incarnation(etcd: &Etcd, endpoints: &str) -> Incarnation {
    let (history, head) = owner_history(endpoints);
    Incarnation {
        base: etcd
            .get(mini_letta::cluster::EPOCH_BASE_KEY)
            .parse()
            .unwrap_or(0),
        history,
        head,
    }
}

/// Roll agent `id`'s remote `main` back to its first parent (as someone
/// with write access to the remote might), with git's own ref lock; the
/// operator's restore, to what the fence records (or what main was), to
/// run later. `None` when there is nothing to roll back or a push holds
/// the lock right now.
fn roll_back(world: &World, id: &str) -> Option<Undo> {
    let repo = Repository::open_bare(world.bare(id)).ok()?;
    let main = repo.refname_to_id("refs/heads/main").ok()?;
    let parent = repo.find_commit(main).ok()?.parent_id(0).ok()?;
    repo.reference_matching(
        "refs/heads/main",
        parent,
        true,
        main,
        "soak: rolled back behind the owners' backs",
    )
    .ok()?;
    world.rolled_back.lock().unwrap().insert(parent);
    let id = id.to_string();
    Some(Box::new(move |w: &World| {
        let repo = Repository::open_bare(w.bare(&id)).unwrap();
        let recorded = repo
            .refname_to_id(FENCE_REF)
            .ok()
            .and_then(|f| fence::fenced_main(&repo, f));
        // The later of what main was and what the fence records.
        let to = match recorded {
            Some(r) if repo.graph_descendant_of(r, main).unwrap_or(false) => r,
            _ => main,
        };
        // Nothing moves a rolled-back main (every sync refuses it); the
        // restore retries only a lock held for a moment.
        for _ in 0..50 {
            if repo
                .reference_matching("refs/heads/main", to, true, parent, "soak: restored")
                .is_ok()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("{id}: the rolled-back main could not be restored");
    }))
}

/// Every fault undone: supervisors running, all etcd members up.
fn heal(world: &World) {
    for h in 0..HOSTS {
        if let Some(pid) = world.pids.lock().unwrap()[h] {
            signal(pid, nix::sys::signal::Signal::SIGCONT);
        }
        if world.pids.lock().unwrap()[h].is_none() {
            world.start_supervisor(h);
        }
    }
    let mut etcd = world.etcd.lock().unwrap();
    for m in 0..3 {
        etcd.restart(m);
    }
    assert!(
        etcd.wait_healthy(Duration::from_secs(30)),
        "{}",
        etcd.logs()
    );
}

/// The remote `main` of `id`, read as git would (`None` before any push).
fn remote_ref(world: &World, id: &str, name: &str) -> Option<Oid> {
    let repo = Repository::open_bare(world.bare(id)).ok()?;
    repo.refname_to_id(name).ok()
}

/// Sample every remote `main` until `done`; each sample is kept in order.
fn sample_remotes(world: &World, done: &AtomicBool, samples: &Mutex<HashMap<String, Vec<Oid>>>) {
    while !done.load(Ordering::SeqCst) {
        for (_, id) in &world.agents {
            if let Some(tip) = remote_ref(world, id, "refs/heads/main") {
                let mut s = samples.lock().unwrap();
                let seen = s.entry(id.clone()).or_default();
                if seen.last() != Some(&tip) {
                    seen.push(tip);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Samples of one remote `main` that are not ancestors of the next one
/// (a forced or diverged history) — each sample must also be in the final
/// `main`.
fn backwards_moves(repo: &Repository, samples: &[Oid], last: Oid) -> usize {
    let mut bad = 0;
    let mut chain: Vec<Oid> = samples.to_vec();
    chain.push(last);
    for w in chain.windows(2) {
        let forward = w[0] == w[1] || repo.graph_descendant_of(w[1], w[0]).unwrap_or(false);
        if !forward {
            bad += 1;
        }
    }
    bad
}

/// etcd's history of every owner key: `(key, kind, value, revision,
/// create revision)` in revision order.
fn owner_history(endpoints: &str) -> (History, i64) {
    use etcd_client::{Client, EventType, WatchOptions};
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let eps: Vec<&str> = endpoints.split(',').collect();
        let mut c = Client::connect(eps, None).await.unwrap();
        // A request the client hands to a member that is not listening yet
        // fails at once: asked again.
        let mut tries = 0;
        let (head, mut stream) = loop {
            tries += 1;
            let options = WatchOptions::new().with_prefix().with_start_revision(1);
            let started = async {
                let head = c
                    .get("/", None)
                    .await?
                    .header()
                    .map(|h| h.revision())
                    .unwrap_or(0);
                let stream = c.watch("/mini-letta/agents/", Some(options)).await?;
                Ok::<_, etcd_client::Error>((head, stream))
            };
            match started.await {
                Ok(v) => break v,
                Err(e) if tries < 40 => {
                    eprintln!("reading etcd's history: {e}; again");
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => panic!("cannot read etcd's history: {e}"),
            }
        };
        let mut events = Vec::new();
        loop {
            let next = tokio::time::timeout(Duration::from_secs(3), stream.message()).await;
            let Ok(Ok(Some(resp))) = next else { break };
            let mut last = 0;
            for e in resp.events() {
                let Some(kv) = e.kv() else { continue };
                last = kv.mod_revision();
                events.push((
                    String::from_utf8_lossy(kv.key()).into_owned(),
                    e.event_type() == EventType::Put,
                    String::from_utf8_lossy(kv.value()).into_owned(),
                    kv.mod_revision(),
                    kv.create_revision(),
                ));
            }
            if last >= head {
                break;
            }
        }
        (events, head)
    })
}

/// The owner checks. From etcd's own history: every owner key created only
/// while absent (never two owners at one revision). From each host's
/// audit log (its chain verified first): every `taken` record names an
/// epoch etcd gave that host, and, over all hosts, every agent's
/// ownerships in epoch order never overlap — each ended (`released`, or
/// `lost` at the last instant its lease was surely alive) before the next
/// began. An ownership whose host was killed has no end record: it is
/// counted, and left to etcd's history and the fence chains.
struct OwnerAudit {
    /// Owner changes in etcd's history (takes).
    changes: usize,
    /// `owner` records read from the hosts' audit logs.
    records: usize,
    /// Successive ownerships whose order the audit shows.
    checked: usize,
    /// Ownerships ended by a kill (no end record).
    unended: usize,
    /// Takes between reading an etcd's history and wiping it (judged by
    /// nothing but the audit logs' order and the fence chains).
    unobserved: usize,
    /// Two owners at once, per etcd's history or the audit logs.
    bad: Vec<String>,
}

/// One ownership of an agent as the audit logs show it.
struct Span {
    host: usize,
    /// `taken`'s `at_ms`.
    began: Option<u64>,
    /// `released`'s or `lost`'s `at_ms`.
    ended: Option<u64>,
}

/// (agent id, epoch).
type Epoch = (String, i64);

fn audit_owners(world: &World, incarnations: &[Incarnation]) -> OwnerAudit {
    let mut out = OwnerAudit {
        changes: 0,
        records: 0,
        checked: 0,
        unended: 0,
        unobserved: 0,
        bad: Vec::new(),
    };
    let mut epochs = HashMap::new();
    for inc in incarnations {
        epochs.extend(etcd_owners(inc, &mut out));
    }
    let spans = owner_spans(world, &epochs, incarnations, &mut out);
    let mut last: Option<(&Epoch, &Span)> = None;
    for (key, span) in &spans {
        if let Some((pkey, prev)) = last.filter(|(k, _)| k.0 == key.0) {
            match (prev.ended, span.began) {
                (Some(ended), Some(began)) => {
                    out.checked += 1;
                    if ended > began {
                        out.bad.push(format!(
                            "{}: host {} owned it (epoch {}) until {ended}, host {} from {began} (epoch {})",
                            key.0, prev.host, pkey.1, span.host, key.1
                        ));
                    }
                }
                (None, _) => out.unended += 1,
                (Some(_), None) => out
                    .bad
                    .push(format!("{} epoch {}: ended but never taken", key.0, key.1)),
            }
        }
        last = Some((key, span));
    }
    out
}

/// One etcd incarnation's history: never two owners at once; which host
/// each fence epoch (the base plus the take's revision) went to.
fn etcd_owners(inc: &Incarnation, out: &mut OwnerAudit) -> HashMap<Epoch, String> {
    let mut owner: HashMap<&str, &str> = HashMap::new();
    let mut epochs = HashMap::new();
    for (key, put, value, rev, create) in &inc.history {
        if !*put {
            owner.remove(key.as_str());
            continue;
        }
        if *rev == *create {
            out.changes += 1;
            if let Some(prev) = owner.get(key.as_str()) {
                out.bad.push(format!(
                    "{key}: {value} took it at {rev} while {prev} held it"
                ));
            }
        }
        owner.insert(key, value);
        let agent = key
            .trim_start_matches("/mini-letta/agents/")
            .trim_end_matches("/owner");
        epochs.insert((agent.to_string(), inc.base + *create), value.clone());
    }
    epochs
}

/// Every host's `owner` records (each chain verified first), as spans.
fn owner_spans(
    world: &World,
    epochs: &HashMap<Epoch, String>,
    incarnations: &[Incarnation],
    out: &mut OwnerAudit,
) -> BTreeMap<Epoch, Span> {
    let mut spans: BTreeMap<Epoch, Span> = BTreeMap::new();
    for h in 0..HOSTS {
        let home = mini_letta::paths::Home::at(world.homes[h].path());
        match mini_letta::audit::verify::verify(&home, None) {
            Ok(r) if r.ok() => {}
            other => out
                .bad
                .push(format!("host {h}: audit chain broken: {other:?}")),
        }
        let read = mini_letta::audit::read::for_each(&home, |line, view| {
            if view.kind == mini_letta::audit::kind::OWNER {
                out.records += 1;
                let v: serde_json::Value = serde_json::from_slice(line).unwrap_or_default();
                let key = (
                    view.agent.clone().unwrap_or_default(),
                    v["epoch"].as_i64().unwrap_or(-1),
                );
                let span = spans.entry(key.clone()).or_insert(Span {
                    host: h,
                    began: None,
                    ended: None,
                });
                if span.host != h || v["host"] != host_id(h).as_str() {
                    out.bad
                        .push(format!("{key:?}: recorded by hosts {h} and {}", span.host));
                }
                if v["change"] == "taken" {
                    span.began = v["at_ms"].as_u64();
                    if !epochs.contains_key(&key) && unobserved(incarnations, key.1) {
                        out.unobserved += 1;
                    } else if epochs.get(&key) != Some(&host_id(h)) {
                        out.bad.push(format!(
                            "host {h} recorded taking {key:?}, etcd gave it to {:?}",
                            epochs.get(&key)
                        ));
                    }
                } else {
                    span.ended = v["at_ms"].as_u64();
                }
            }
            std::ops::ControlFlow::Continue(())
        });
        if let Err(e) = read {
            out.bad.push(format!("host {h}: audit log unreadable: {e}"));
        }
    }
    spans
}

/// Along a remote's fence chain (first parents), the epochs never go back,
/// and each commit was pushed by the host etcd gave its epoch to.
fn audit_fence(repo: &Repository, agent: &str, incarnations: &[Incarnation]) -> Vec<String> {
    let Ok(tip) = repo.refname_to_id(FENCE_REF) else {
        return Vec::new();
    };
    let key = mini_letta::cluster::owner_key(agent);
    let given: HashMap<i64, &str> = incarnations
        .iter()
        .flat_map(|inc| {
            inc.history
                .iter()
                .filter(|(k, put, _, rev, create)| *k == key && *put && rev == create)
                .map(move |(_, _, v, rev, _)| (inc.base + *rev, v.as_str()))
        })
        .collect();
    let mut bad = Vec::new();
    let mut newer = i64::MAX;
    let mut at = repo.find_commit(tip).ok();
    while let Some(c) = at {
        match Stamp::parse(&String::from_utf8_lossy(c.message_bytes())) {
            Some(s) => {
                if s.epoch > newer {
                    bad.push(format!("{agent}: fence epoch {} after {newer}", s.epoch));
                }
                newer = newer.min(s.epoch);
                let unseen = !given.contains_key(&s.epoch) && unobserved(incarnations, s.epoch);
                if !unseen && given.get(&s.epoch) != Some(&s.host.as_str()) {
                    bad.push(format!(
                        "{agent}: {} pushed in epoch {}, which etcd gave {:?}",
                        s.host,
                        s.epoch,
                        given.get(&s.epoch)
                    ));
                }
            }
            None => bad.push(format!("{agent}: fence commit {} unstamped", c.id())),
        }
        // First parents, down to a first claim (whose parent is `main`).
        at = fence::previous(repo, c.id()).and_then(|p| repo.find_commit(p).ok());
    }
    bad
}

/// `path` in the tree of commit `id` ("" when absent).
fn file_at(repo: &Repository, id: Oid, path: &str) -> String {
    let Ok(tree) = repo.find_commit(id).and_then(|c| c.tree()) else {
        return String::new();
    };
    let Ok(entry) = tree.get_path(Path::new(path)) else {
        return String::new();
    };
    repo.find_blob(entry.id())
        .map(|b| String::from_utf8_lossy(b.content()).into_owned())
        .unwrap_or_default()
}

fn report(
    world: &World,
    acked: &Mutex<Vec<Vec<String>>>,
    tally: &Mutex<Tally>,
    samples: &Mutex<HashMap<String, Vec<Oid>>>,
    took: Duration,
) -> ExitCode {
    let mut incarnations = std::mem::take(&mut *world.past.lock().unwrap());
    incarnations.push(incarnation(&world.etcd.lock().unwrap(), &world.endpoints));
    let owners = audit_owners(world, &incarnations);
    let mut violations = owners.bad.clone();
    let (mut lost, mut backwards, mut fence_bad) = (0, 0, 0);
    for (i, (name, id)) in world.agents.iter().enumerate() {
        let repo = Repository::open_bare(world.bare(id)).unwrap();
        let main = repo.refname_to_id("refs/heads/main").unwrap();
        let human = file_at(&repo, main, "human.md");
        for fact in &acked.lock().unwrap()[i] {
            if !human.lines().any(|l| l.trim() == format!("- {fact}")) {
                lost += 1;
                violations.push(format!(
                    "{name}: acknowledged fact {fact} is not on the remote"
                ));
            }
        }
        let rolled = world.rolled_back.lock().unwrap().clone();
        let seen: Vec<Oid> = samples
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !rolled.contains(s))
            .collect();
        let b = backwards_moves(&repo, &seen, main);
        if b > 0 {
            violations.push(format!(
                "{name}: the remote main moved backwards {b} time(s)"
            ));
        }
        backwards += b;
        let f = audit_fence(&repo, id, &incarnations);
        fence_bad += f.len();
        violations.extend(f);
    }
    let t = tally.lock().unwrap();
    println!(
        "several-hosts soak: {HOSTS} hosts, {} agents, lease {LEASE_SECS} s, {:.0} s of load",
        world.agents.len(),
        took.as_secs_f64()
    );
    println!(
        "  turns {} | acknowledged {} | refused: owned elsewhere {}, etcd {} | not acknowledged (push refused) {} | client gave up {} | other {}",
        t.turns,
        t.acknowledged,
        t.refused_owner,
        t.refused_etcd,
        t.not_acknowledged,
        t.gave_up,
        t.failed.values().sum::<u64>()
    );
    for (why, n) in &t.failed {
        println!("    {n} x {why}");
    }
    println!(
        "  releases {} (refused: not owned here, not cloned here, or no lease {}) | owner changes in etcd {} ({} etcd lives) | owner records in the audit logs {}: {} successive ownerships checked, {} ended by a kill (no end record), {} taken as etcd was wiped (unobserved)",
        t.releases,
        t.releases_refused,
        owners.changes,
        incarnations.len(),
        owners.records,
        owners.checked,
        owners.unended,
        owners.unobserved
    );
    let faults: Vec<String> = t.faults.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!("  faults: {}", faults.join(", "));
    println!(
        "  acknowledged facts lost {lost} | forced or diverged remote histories {backwards} | two owners at once (etcd history, audit logs) {} | pushes outside the pusher's ownership (fence chains) {fence_bad}",
        owners.bad.len()
    );
    for v in &violations {
        println!("  VIOLATION: {v}");
    }
    for h in 0..HOSTS {
        let _ = world.run(
            h,
            &["supervisor", "stop", "--timeout", "5"],
            Duration::from_secs(30),
        );
    }
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
