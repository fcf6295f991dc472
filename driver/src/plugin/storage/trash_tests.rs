use std::os::unix::fs::PermissionsExt;

use super::*;

/// A claims' root with one claim directory, `u1`.
fn claims() -> (tempfile::TempDir, PathBuf, Trash) {
    let root = tempfile::tempdir().unwrap();
    let claim = root.path().join("u1");
    std::fs::create_dir(&claim).unwrap();
    let trash = Trash::new(root.path());
    (root, claim, trash)
}

fn trash_is_empty(trash: &Trash) -> bool {
    std::fs::read_dir(trash.dir()).unwrap().next().is_none()
}

/// Runs `f` on a thread with a small stack, as a runtime worker would be: removal must not need
/// stack in proportion to the tree's depth.
fn on_small_stack<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::Builder::new().stack_size(256 * 1024).spawn(f).unwrap().join().unwrap()
}

#[test]
fn a_discarded_directory_leaves_its_name_at_once_and_goes_when_emptied() {
    let (_root, claim, trash) = claims();
    std::fs::write(claim.join("GPU-1.cache"), b"region").unwrap();
    assert!(trash.discard(&claim).unwrap());
    assert!(!claim.exists(), "the claim's name is free for the next prepare");
    assert_eq!(std::fs::metadata(trash.dir()).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(trash.empty(DEFAULT_BUDGET), Emptied { removed: 1, left: 0, error: None });
    assert!(trash_is_empty(&trash));
    assert!(!trash.discard(&claim).unwrap(), "nothing to discard twice");
    // The same claim directory again (a claim prepared anew after an unprepare) gets a name of its own.
    std::fs::create_dir(&claim).unwrap();
    std::fs::create_dir(claim.parent().unwrap().join("u2")).unwrap();
    assert!(trash.discard(&claim).unwrap());
    std::fs::create_dir(&claim).unwrap();
    assert!(trash.discard(&claim).unwrap());
    assert_eq!(std::fs::read_dir(trash.dir()).unwrap().count(), 2);
    assert_eq!(trash.empty(DEFAULT_BUDGET).removed, 2);
}

#[test]
fn fifty_thousand_levels_cost_no_stack_and_leak_no_descriptor() {
    let (_root, claim, trash) = claims();
    // Built through relative paths, as `mkdir d; cd d` in a loop does: no path could name the
    // bottom (PATH_MAX is 4096).
    let mut fd = rustix::fs::openat(CWD, &claim, dir_flags(), Mode::empty()).unwrap();
    for _ in 0..50_000 {
        rustix::fs::mkdirat(&fd, c"d", Mode::RWXU).unwrap();
        fd = rustix::fs::openat(&fd, c"d", dir_flags(), Mode::empty()).unwrap();
    }
    rustix::fs::openat(&fd, c"fifo-like-file", OFlags::CREATE | OFlags::WRONLY, Mode::RUSR).unwrap();
    drop(fd);
    assert!(trash.discard(&claim).unwrap());
    let open_before = open_descriptors();
    let emptied = on_small_stack({
        let trash = trash.clone();
        move || trash.empty(DEFAULT_BUDGET)
    });
    assert_eq!(emptied, Emptied { removed: 1, left: 0, error: None });
    assert!(trash_is_empty(&trash));
    assert!(open_descriptors() <= open_before, "no descriptor leaked");
}

fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_hundred_thousand_files_fifos_sockets_and_links_go_without_being_opened() {
    let (root, claim, trash) = claims();
    let wide = claim.join("wide");
    std::fs::create_dir(&wide).unwrap();
    for i in 0..100_000 {
        std::fs::File::create(wide.join(format!("f{i}"))).unwrap();
    }
    // A FIFO: opening it to read would block the daemon for ever.
    rustix::fs::mknodat(CWD, claim.join("fifo"), FileType::Fifo, Mode::RUSR | Mode::WUSR, 0).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(claim.join("sock")).unwrap();
    // Links to a host file and a host directory: followed, they would take the host's files.
    let host = root.path().join("host");
    std::fs::create_dir(&host).unwrap();
    std::fs::write(host.join("precious"), b"keep").unwrap();
    std::os::unix::fs::symlink(&host, claim.join("link-to-dir")).unwrap();
    std::os::unix::fs::symlink(host.join("precious"), claim.join("link-to-file")).unwrap();
    assert!(trash.discard(&claim).unwrap());
    let emptied = on_small_stack({
        let trash = trash.clone();
        move || trash.empty(DEFAULT_BUDGET)
    });
    assert_eq!(emptied, Emptied { removed: 1, left: 0, error: None });
    assert!(trash_is_empty(&trash));
    assert_eq!(std::fs::read(host.join("precious")).unwrap(), b"keep", "nothing outside the trash is touched");
}

#[test]
fn an_unreadable_subdirectory_and_a_file_held_open_are_removed() {
    let (_root, claim, trash) = claims();
    let locked = claim.join("locked");
    std::fs::create_dir_all(locked.join("inner")).unwrap();
    std::fs::write(locked.join("inner").join("f"), b"x").unwrap();
    std::fs::set_permissions(locked.join("inner"), std::fs::Permissions::from_mode(0o000)).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    // A container's process still writing its shared region.
    let mut held = std::fs::File::create(claim.join("GPU-1.cache")).unwrap();
    assert!(trash.discard(&claim).unwrap());
    std::io::Write::write_all(&mut held, b"still writing").unwrap();
    assert_eq!(trash.empty(DEFAULT_BUDGET), Emptied { removed: 1, left: 0, error: None });
    assert!(trash_is_empty(&trash));
}

#[test]
fn a_spent_budget_leaves_the_rest_for_the_next_pass() {
    let (_root, claim, trash) = claims();
    for i in 0..1_000 {
        std::fs::create_dir_all(claim.join(format!("d{i}")).join("e")).unwrap();
    }
    assert!(trash.discard(&claim).unwrap());
    let mut passes = 0;
    loop {
        passes += 1;
        let emptied = trash.empty(500);
        assert_eq!(emptied.error, None);
        if emptied.left == 0 {
            assert_eq!(emptied.removed, 1);
            break;
        }
        assert!(passes < 100, "every pass makes progress");
    }
    assert!(passes > 1, "one pass of 500 operations cannot remove 2,000 directories");
    assert!(trash_is_empty(&trash));
}

#[test]
fn an_entry_that_is_not_a_directory_is_unlinked() {
    let root = tempfile::tempdir().unwrap();
    let trash = Trash::new(root.path());
    let file = root.path().join("u1");
    std::fs::write(&file, b"a file where a claim directory was").unwrap();
    assert!(trash.discard(&file).unwrap());
    assert_eq!(trash.empty(DEFAULT_BUDGET).removed, 1);
    assert!(trash_is_empty(&trash));
    assert_eq!(Trash::new(&root.path().join("none")).empty(10), Emptied::default(), "no trash, nothing to do");
}
