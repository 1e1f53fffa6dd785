//! Waiting for a forked child with a deadline: the fork tests' verdict on
//! one child (exited with 0, failed, or hung on a lock copied held).

use std::time::{Duration, Instant};

/// Waits for our child `pid` up to `limit`, polling every 100 µs.
///
/// `Ok` if it exited with status 0. Otherwise `Err` says how it ended, or
/// that it hung: then `describe_hang` is asked for more (its stack, say)
/// while the child still exists, and the child is killed and reaped.
pub fn wait_child(
    pid: libc::pid_t,
    limit: Duration,
    describe_hang: impl FnOnce(libc::pid_t) -> String,
) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let mut status = 0;
        // SAFETY: waits for our own child without blocking.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
                Ok(())
            } else {
                Err(format!("ended with status {status:#x}"))
            };
        }
        if r < 0 {
            return Err(format!(
                "waitpid failed: {}",
                std::io::Error::last_os_error()
            ));
        }
        if start.elapsed() > limit {
            let more = describe_hang(pid);
            // SAFETY: kills and reaps our own hung child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            return Err(format!("hung for {limit:?}{more}"));
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Every thread's stack of the process `pid`, from gdb (if it is there):
/// what a hung child was waiting on.
pub fn stacks_of(pid: libc::pid_t) -> String {
    match std::process::Command::new("gdb")
        .args([
            "-p",
            &pid.to_string(),
            "-batch",
            "-ex",
            "thread apply all bt",
        ])
        .output()
    {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => format!("(no stack: {e})"),
    }
}
