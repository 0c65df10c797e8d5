//! A process's code compared with its files (shared by the detach and pid tests).
#![allow(dead_code)]

/// Every executable mapping of a file in process `pid`, but the agent's own library, compared
/// byte for byte with the file. Returns how many bytes were compared.
pub fn code_as_in_files(pid: u32) -> usize {
    use std::os::unix::fs::FileExt;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut compared = 0;
    let mut files = 0;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || !f[5].starts_with('/') || f[5].contains("libuserbpf_agent") {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
        let off = u64::from_str_radix(f[2], 16).unwrap();
        let file = std::fs::File::open(f[5]).unwrap();
        let flen = file.metadata().unwrap().len();
        let len = (e - s).min(flen.saturating_sub(off)) as usize;
        let mut a = vec![0u8; len];
        let mut b = vec![0u8; len];
        mem.read_exact_at(&mut a, s).unwrap();
        file.read_exact_at(&mut b, off).unwrap();
        // A kernel uprobe (another test's, on libc) is an int3 in every process mapping the
        // file: a byte that differs the same way in this test's own mapping of the file is not
        // ours.
        for i in 0..len {
            if a[i] != b[i] && own_byte(f[5], off + i as u64) == Some(a[i]) {
                b[i] = a[i];
            }
        }
        if a != b {
            let i = a.iter().zip(&b).position(|(x, y)| x != y).unwrap();
            panic!(
                "{} differs from its file at {:#x} (file offset {:#x}): {:02x?} vs {:02x?}",
                f[5],
                s + i as u64,
                off + i as u64,
                &a[i..(i + 8).min(len)],
                &b[i..(i + 8).min(len)]
            );
        }
        compared += len;
        files += 1;
    }
    assert!(files >= 3, "the program, libc and ld.so: {maps}");
    compared
}

/// The byte at file offset `off` of `path` as this process has it mapped (if it does).
fn own_byte(path: &str, off: u64) -> Option<u8> {
    let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[5] != path {
            continue;
        }
        let (s, e) = f[0].split_once('-')?;
        let (s, e) = (u64::from_str_radix(s, 16).ok()?, u64::from_str_radix(e, 16).ok()?);
        let moff = u64::from_str_radix(f[2], 16).ok()?;
        if off >= moff && off < moff + (e - s) {
            let mut b = [0u8];
            std::os::unix::fs::FileExt::read_exact_at(
                &std::fs::File::open("/proc/self/mem").ok()?,
                &mut b,
                s + off - moff,
            )
            .ok()?;
            return Some(b[0]);
        }
    }
    None
}

/// Whether some executable mapping of file `path` in process `pid` differs from the file (a
/// probe is in place: a kernel uprobe's int3 or userbpf's jump).
pub fn patched(pid: u32, path: &std::path::Path) -> bool {
    use std::os::unix::fs::FileExt;
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else { return false };
    let Ok(mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else { return false };
    let path = path.to_string_lossy();
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || !f[1].contains('x') || f[5] != path {
            continue;
        }
        let (s, e) = f[0].split_once('-').unwrap();
        let (s, e) = (u64::from_str_radix(s, 16).unwrap(), u64::from_str_radix(e, 16).unwrap());
        let off = u64::from_str_radix(f[2], 16).unwrap();
        let file = std::fs::File::open(f[5]).unwrap();
        let len = (e - s).min(file.metadata().unwrap().len().saturating_sub(off)) as usize;
        let (mut a, mut b) = (vec![0u8; len], vec![0u8; len]);
        if mem.read_exact_at(&mut a, s).is_err() || file.read_exact_at(&mut b, off).is_err() {
            return false;
        }
        if a != b {
            return true;
        }
    }
    false
}

/// The threads of process `pid` named `userbpf-agent`.
pub fn agent_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter(|e| std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "userbpf-agent"))
                .count()
        })
        .unwrap_or(0)
}
