//! A snapshot file as a leader sends it (cairn-store's `unpack_dir`): whatever the bytes,
//! nothing is created outside the directory it unpacks into and only plain files inside
//! it. What unpacks holds exactly the files an independent reading of the format names
//! (the last of two with one name wins), and packing that directory again unpacks to the
//! same files.
#![no_main]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cairn_store::{pack_dir, unpack_dir};
use libfuzzer_sys::fuzz_target;

const MAGIC: &[u8] = b"CAIRN-SNAPSHOT-1\n";

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // tmpfs when there is one: every run writes files.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("cairn-fuzz-unpack-{}", std::process::id()));
        fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fn files_in(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    for entry in fs::read_dir(dir).expect("read_dir") {
        let entry = entry.expect("entry");
        let kind = entry.file_type().expect("file type");
        assert!(kind.is_file(), "{:?} is not a plain file", entry.path());
        files.insert(
            entry.file_name().into_string().expect("UTF-8 name"),
            fs::read(entry.path()).expect("read"),
        );
    }
    files
}

/// The files the format says `bytes` holds, or None when it does not parse to the end
/// marker (read independently of `unpack_dir`).
fn expected_files(bytes: &[u8]) -> Option<BTreeMap<String, Vec<u8>>> {
    let mut rest = bytes.strip_prefix(MAGIC)?;
    let mut files = BTreeMap::new();
    loop {
        let (len, tail) = rest.split_first_chunk::<4>()?;
        let name_len = u32::from_be_bytes(*len) as usize;
        if name_len == 0 {
            return Some(files);
        }
        if name_len > 4096 || tail.len() < name_len {
            return None;
        }
        let (name, tail) = tail.split_at(name_len);
        let name = String::from_utf8(name.to_vec()).ok()?;
        if name.contains(['/', '\\', '\0']) || name == "." || name == ".." {
            return None;
        }
        let (len, tail) = tail.split_first_chunk::<8>()?;
        let len = usize::try_from(u64::from_be_bytes(*len)).ok()?;
        if tail.len() < len {
            return None;
        }
        let (content, tail) = tail.split_at(len);
        files.insert(name, content.to_vec());
        rest = tail;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&kind, body)) = data.split_first() else {
        return;
    };
    let bytes = if kind & 1 == 0 {
        [MAGIC, body].concat()
    } else {
        body.to_vec()
    };
    let root = scratch();
    let packed = root.join("in.pack");
    let out = root.join("out");
    fs::write(&packed, &bytes).expect("write input");
    let result = unpack_dir(&packed, &out);
    // Nothing but the input and the output directory, whatever happened.
    let mut names: Vec<_> = fs::read_dir(root)
        .expect("read scratch")
        .map(|e| e.expect("entry").file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["in.pack", "out"], "unpacking touched {root:?}");
    let got = files_in(&out);
    match (result, expected_files(&bytes)) {
        (Ok(()), Some(expected)) => {
            assert_eq!(got, expected);
            let again = root.join("again.pack");
            pack_dir(&out, &again).expect("pack");
            let back = root.join("back");
            unpack_dir(&again, &back).expect("unpack what was packed");
            assert_eq!(files_in(&back), expected);
            fs::remove_dir_all(&back).expect("clean");
            fs::remove_file(&again).expect("clean");
        }
        (Err(_), None) => {}
        (result, expected) => panic!(
            "unpack_dir: {result:?}, the format says: {:?}",
            expected.map(|files| files.into_keys().collect::<Vec<_>>())
        ),
    }
    fs::remove_dir_all(&out).expect("clean");
});
