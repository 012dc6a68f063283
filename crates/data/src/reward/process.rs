//! A scorer's process: started in a process group of its own, so that ending it ends whatever
//! it started too (a shell script's `sleep 300 &`, a worker pool), and every group still
//! running known, so that a job stopping on a path that skips destructors can end them all.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Mutex};

/// The process groups of the scorers running now.
static GROUPS: Mutex<Vec<i32>> = Mutex::new(Vec::new());

/// The child, its input, its output lines and the end of its stderr.
pub(super) struct Process {
    child: Child,
    /// Its standard input (taken by a batch's writer while it writes).
    pub stdin: Option<ChildStdin>,
    /// Its standard output, line by line.
    pub lines: Receiver<std::io::Result<String>>,
    /// The last line it wrote to stderr.
    pub stderr: Arc<Mutex<String>>,
    ended: bool,
}

impl Process {
    /// Starts `program args` in a new process group, its standard streams piped.
    pub fn spawn(program: &str, args: &[String]) -> std::io::Result<Process> {
        let mut child = Command::new(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()?;
        GROUPS.lock().unwrap_or_else(|e| e.into_inner()).push(child.id() as i32);
        let stdout = child.stdout.take().expect("stdout is piped");
        let (send, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let (sink, pipe) = (Arc::clone(&stderr), child.stderr.take().expect("stderr is piped"));
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                *sink.lock().unwrap_or_else(|e| e.into_inner()) = line; // the last line says most
            }
        });
        Ok(Process { stdin: child.stdin.take(), child, lines, stderr, ended: false })
    }

    /// Whether the scorer itself has exited; it is not reaped, so its process group's id stays
    /// its own until [`Process::end`] has signalled the group.
    pub fn has_exited(&self) -> bool {
        // SAFETY: waitid only writes the zeroed siginfo_t it is given; WNOWAIT leaves the
        // child to be reaped by `Child::wait`.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            libc::waitid(libc::P_PID, self.child.id(), &mut info, flags) == 0 && info.si_pid() != 0
        }
    }

    /// Whether [`Process::end`] has ended it.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Ends the scorer's whole process group (SIGKILL) and reaps the scorer: its exit status.
    pub fn end(&mut self) -> Option<ExitStatus> {
        if !self.ended {
            self.ended = true;
            kill_group(self.child.id() as i32);
            GROUPS.lock().unwrap_or_else(|e| e.into_inner()).retain(|&g| g != self.child.id() as i32);
        }
        self.child.wait().ok()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.end();
    }
}

/// SIGKILL to every process of group `group`.
fn kill_group(group: i32) {
    // SAFETY: kill has no memory effects; a group that has ended already is ESRCH, ignored.
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

/// Ends every scorer's process group still running: for a job that stops without unwinding
/// (`MPI_Abort`, the watchdog), which would otherwise leave them behind. Never blocks: a lock
/// held elsewhere at that moment is passed over.
pub fn end_all_scorers() {
    if let Ok(groups) = GROUPS.try_lock() {
        groups.iter().copied().for_each(kill_group);
    }
}

/// Ends every scorer's process group, then this process with the shell's status (128 + the
/// signal), on SIGINT, SIGTERM or SIGHUP: a scorer in a group of its own no longer gets the
/// terminal's Ctrl-C with us. For commands that do not answer those signals themselves
/// (`nereus reward`; a training job checkpoints and drops its scorer instead).
pub fn end_scorers_on_signals() -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::spawn(move || {
        if let Some(signal) = signals.forever().next() {
            end_all_scorers();
            std::process::exit(128 + signal);
        }
    });
    Ok(())
}
