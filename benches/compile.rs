//! Compiler benchmark: builds memory repositories of 10, 100, 1,000 and 5,000
//! `.md` files in both layouts and prints, per repository, the median
//! in-process compile time and the median whole-process time of
//! `mini-letta memory compile`, with the ratio to letta-code's figures
//! measured on the same class of machine (spec/compiler.md §12).
//!
//! Run: `cargo bench --bench compile` (or `scripts/bench-compile`); 31 runs
//! per case, medians; `--quick` for 3.
//! Repository shape (as the spec's generator): core = min(20, N/2) files (root
//! files for v2, `system/` for v1), the rest on-demand in `area-NNN/`
//! directories of ~40 files, half of them one level deeper, each directory
//! with a `MEMORY.md` in v2.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use git2::{Repository, RepositoryInitOptions, Signature};
use mini_letta::memfs::compiler::{CompileOptions, compile_dir};
use time::OffsetDateTime;

/// letta-code whole-process medians in ms (spec/compiler.md §12).
const LETTA_PROCESS_MS: [(&str, usize, f64); 8] = [
    ("v2", 10, 70.9),
    ("v2", 100, 79.3),
    ("v2", 1000, 145.0),
    ("v2", 5000, 333.6),
    ("v1", 10, 79.2),
    ("v1", 100, 232.9),
    ("v1", 1000, 1675.7),
    ("v1", 5000, 6767.7),
];

fn body(i: usize) -> String {
    format!(
        "---\nname: File {i}\ndescription: Notes number {i} about a topic worth remembering.\n---\n\n- fact one about item {i}\n- fact two about item {i}\n- a longer line that says a little more about item {i} and why it matters\n"
    )
}

fn build(dir: &Path, format: &str, n: usize) {
    let mut opts = RepositoryInitOptions::new();
    opts.initial_head("main");
    let repo = Repository::init_opts(dir, &opts).unwrap();
    let mut index = repo.index().unwrap();
    let mut add = |path: String, text: String| {
        let oid = repo.blob(text.as_bytes()).unwrap();
        let mut entry = git2::IndexEntry {
            ctime: git2::IndexTime::new(0, 0),
            mtime: git2::IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode: 0o100644,
            uid: 0,
            gid: 0,
            file_size: text.len() as u32,
            id: oid,
            flags: 0,
            flags_extended: 0,
            path: path.into_bytes(),
        };
        entry.flags = (entry.path.len().min(0xfff)) as u16;
        index.add(&entry).unwrap();
    };
    let core = (n / 2).min(20);
    let v2 = format == "v2";
    let mut md = 0;
    if v2 {
        add(
            "MEMORY.md".into(),
            "# Memory\n\n- core files below\n".into(),
        );
        md += 1;
    }
    for i in 0..core {
        let p = if v2 {
            format!("core-{i:03}.md")
        } else {
            format!("system/core-{i:03}.md")
        };
        add(p, body(i));
        md += 1;
    }
    let mut i = 0;
    while md < n {
        let area = i / 40;
        let deeper = (i % 40) >= 20;
        let dir = if deeper {
            format!("area-{area:03}/sub")
        } else {
            format!("area-{area:03}")
        };
        if v2 && i % 40 == 0 {
            add(
                format!("area-{area:03}/MEMORY.md"),
                format!("# Area {area}\n"),
            );
            md += 1;
            if md >= n {
                break;
            }
        }
        if v2 && i % 40 == 20 {
            add(
                format!("{dir}/MEMORY.md"),
                format!("# Area {area} deeper\n"),
            );
            md += 1;
            if md >= n {
                break;
            }
        }
        add(format!("{dir}/note-{i:05}.md"), body(i));
        md += 1;
        i += 1;
    }
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = Signature::now("bench", "bench@example.com").unwrap();
    repo.commit(Some("HEAD"), &sig, &sig, "bench", &tree, &[])
        .unwrap();
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1000.0
}

fn main() {
    support::say_binary();
    let bin = support::bin();
    let quick = std::env::args().any(|a| a == "--quick");
    let runs = if quick { 3 } else { 31 };
    let opts = CompileOptions {
        agent_id: "agent-bench",
        conversation_id: "c",
        system: "{CORE_MEMORY}",
        now: OffsetDateTime::now_utc(),
        previous_message_count: 0,
    };
    let repos: Vec<_> = LETTA_PROCESS_MS
        .iter()
        .map(|(format, n, _)| {
            let dir = tempfile::tempdir().unwrap();
            build(dir.path(), format, *n);
            let bytes = compile_dir(dir.path(), &opts).unwrap().core_memory.len(); // warm-up
            (dir, bytes)
        })
        .collect();
    // What any process costs through the same harness: `/bin/true`, and
    // this binary doing nothing but print its version, alternated.
    let floor = |cmd: &[&std::ffi::OsStr]| {
        let t = Instant::now();
        let o = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
        assert!(o.status.success());
        t.elapsed().as_secs_f64() * 1000.0
    };
    let version = [bin.as_os_str(), "--version".as_ref()];
    let floors = support::alternate(
        runs.max(101),
        vec![
            support::Case::new("mini-letta --version", || floor(&version)),
            support::Case::new("/bin/true", || floor(&["/bin/true".as_ref()])),
        ],
    );
    // Runs go round-robin over the repositories, so a burst of host noise
    // is spread over every case instead of landing on one.
    let mut inproc = vec![Vec::new(); repos.len()];
    let mut process = vec![Vec::new(); repos.len()];
    for _ in 0..runs {
        for (i, (dir, _)) in repos.iter().enumerate() {
            let t = Instant::now();
            std::hint::black_box(compile_dir(dir.path(), &opts).unwrap());
            inproc[i].push(t.elapsed());
            let t = Instant::now();
            let o = Command::new(&bin)
                .args(["memory", "compile", "--memory-dir"])
                .arg(dir.path())
                .output()
                .unwrap();
            process[i].push(t.elapsed());
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
    floors.print("process floor, same harness", "ms");
    println!(
        "format  files  in-process ms  process ms  letta-code process ms  speed-up  coreMemory bytes"
    );
    for (i, (format, n, letta_ms)) in LETTA_PROCESS_MS.iter().enumerate() {
        let (i_ms, p_ms) = (
            median(std::mem::take(&mut inproc[i])),
            median(std::mem::take(&mut process[i])),
        );
        println!(
            "{format:<6}  {n:>5}  {i_ms:>13.3}  {p_ms:>10.3}  {letta_ms:>21.1}  {:>7.0}x  {:>16}",
            letta_ms / p_ms,
            repos[i].1
        );
    }
}
