//! The `nibblejmp` CLI end to end.

use std::process::{Command, Output};

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nibblejmp"))
        .args(args)
        .output()
        .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn create_put_get_keys_info_del_remove() {
    let dir = format!("/dev/shm/nibblejmp-cli-{}", std::process::id());
    let _ = std::fs::remove_dir_all(&dir);
    let o = cli(&["create", &dir, "--capacity", "8M"]);
    assert!(o.status.success(), "{o:?}");
    assert!(stdout(&o).contains("created"));
    assert!(cli(&["put", &dir, "alpha", "one"]).status.success());
    assert!(cli(&["put", &dir, "beta", "two"]).status.success());
    let o = cli(&["get", &dir, "alpha"]);
    assert_eq!(stdout(&o), "one\n");
    let o = cli(&["get", &dir, "gamma"]);
    assert_eq!(o.status.code(), Some(1));
    let o = cli(&["keys", &dir]);
    let mut keys: Vec<_> = stdout(&o).lines().map(String::from).collect();
    keys.sort();
    assert_eq!(keys, ["alpha", "beta"]);
    let o = cli(&["info", &dir]);
    let info = stdout(&o);
    assert!(info.contains("2 keys"), "{info}");
    assert!(info.contains("(this command)"), "{info}");
    assert!(info.contains("alive"), "{info}");
    assert!(cli(&["del", &dir, "alpha"]).status.success());
    assert_eq!(cli(&["del", &dir, "alpha"]).status.code(), Some(1));
    let o = cli(&["recover", &dir]);
    assert!(stdout(&o).contains("rebuilt: true"), "{o:?}");
    assert_eq!(stdout(&cli(&["get", &dir, "beta"])), "two\n");
    assert!(cli(&["compact", &dir]).status.success());
    // Errors: exit 2 and a message.
    let o = cli(&["create", &dir]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("already exists"));
    let o = cli(&["info", "/dev/shm/nibblejmp-cli-does-not-exist"]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(cli(&["frobnicate", &dir]).status.code(), Some(2));
    assert!(cli(&["remove", &dir]).status.success());
    assert!(!std::path::Path::new(&dir).exists());
}
