//! The MemFS validator on random trees: paths and contents from the input
//! (records separated by 0xFF, each `path 0x00 contents`), judged under
//! every policy, against no parent and against the tree itself. It reports
//! or refuses, never panics, and judges the same tree the same way twice.
#![no_main]

use git2::{Index, IndexEntry, IndexTime, Odb, Repository};
use libfuzzer_sys::fuzz_target;
use mini_letta::memfs::validate::{Policy, TreeSnapshot, ValidateOptions, validate};

fuzz_target!(|data: &[u8]| {
    // A repository with no directory: its objects live in an in-memory
    // pack, and go with it after this input.
    let odb = Odb::new().expect("odb");
    odb.add_new_mempack_backend(1).expect("mempack");
    let repo = Repository::from_odb(odb).expect("repository");
    check(&repo, data);
});

fn check(repo: &Repository, data: &[u8]) {
    let mut index = Index::new().expect("index");
    for record in data.split(|b| *b == 0xFF).take(64) {
        let (path, contents) = match record.iter().position(|b| *b == 0) {
            Some(i) => (&record[..i], &record[i + 1..]),
            None => (record, &[][..]),
        };
        if path.is_empty() {
            continue;
        }
        let Ok(id) = repo.blob(contents) else { continue };
        let mode = if path.ends_with(b"@") { 0o120000 } else { 0o100644 };
        let entry = IndexEntry {
            ctime: IndexTime::new(0, 0),
            mtime: IndexTime::new(0, 0),
            dev: 0,
            ino: 0,
            mode,
            uid: 0,
            gid: 0,
            file_size: contents.len() as u32,
            id,
            flags: 0,
            flags_extended: 0,
            path: path.to_vec(),
        };
        let _ = index.add(&entry);
    }
    if let Ok(tree) = TreeSnapshot::from_index(&index) {
        for policy in [Policy::RootMarker, Policy::LegacyOnly, Policy::SharedMemory] {
            let opts = ValidateOptions::new(policy);
            let first = validate(repo, &tree, None, &opts).map(|r| r.render_block());
            let again = validate(repo, &tree, None, &opts).map(|r| r.render_block());
            assert_eq!(first.ok(), again.ok());
            let _ = validate(repo, &tree, Some(&tree), &opts);
        }
    }
}
