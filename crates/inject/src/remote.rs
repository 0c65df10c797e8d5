//! One borrowed thread of another process: seized and stopped with ptrace, its registers and
//! extended FP state saved, function calls run on it, and everything put back on release.

use std::io::IoSliceMut;

use crate::{Arg, InjectError};

/// `NT_X86_XSTATE`: the regset of the whole XSAVE area (x87, SSE, AVX, ...).
const NT_X86_XSTATE: libc::c_int = 0x202;
/// Room for the XSAVE area (the kernel tells the size it wrote; AVX-512 needs about 2.7 KiB).
const XSTATE_MAX: usize = 16 * 1024;
/// Below the thread's stack pointer, the System V red zone that leaf functions may use.
const RED_ZONE: u64 = 128;

/// A thread of another process, stopped for us until [`Borrowed::release`].
pub struct Borrowed {
    pid: i32,
    tid: i32,
    regs: libc::user_regs_struct,
    xstate: Vec<u8>,
    attached: bool,
}

fn ptrace(req: libc::c_uint, tid: i32, addr: usize, data: usize) -> Result<libc::c_long, std::io::Error> {
    // SAFETY: every request made here passes either no memory or a pointer to a buffer of
    // ours of the size the request writes or reads (see the callers).
    let r = unsafe { libc::ptrace(req, tid, addr, data) };
    if r == -1 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// How a wait on the borrowed thread ended.
enum Stop {
    /// Stopped by a signal (delivery stop) or a ptrace event (status >> 16).
    Stopped { sig: i32, event: i32 },
    /// Exited or killed.
    Gone(String),
}

impl Borrowed {
    /// Seizes and stops thread `tid` of `pid`, saving its registers and FP state.
    pub fn seize(pid: i32, tid: i32) -> Result<Borrowed, InjectError> {
        let err =
            |what: &str, e: std::io::Error| InjectError::Ptrace { pid, what: format!("{what} (thread {tid}): {e}") };
        ptrace(libc::PTRACE_SEIZE, tid, 0, 0).map_err(|e| {
            if e.raw_os_error() == Some(libc::EPERM) {
                InjectError::NotAllowed(format!("PTRACE_SEIZE of process {pid} was refused (EPERM): another user's process, a non-dumpable one, or a security policy"))
            } else {
                err("PTRACE_SEIZE", e)
            }
        })?;
        let mut b = Borrowed { pid, tid, regs: zeroed_regs(), xstate: vec![0; XSTATE_MAX], attached: true };
        ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).map_err(|e| err("PTRACE_INTERRUPT", e))?;
        // The first stop: the interrupt (PTRACE_EVENT_STOP), or a signal arriving first, which
        // is delivered when the thread goes on.
        loop {
            match b.wait()? {
                Stop::Stopped { event, .. } if event == libc::PTRACE_EVENT_STOP => break,
                Stop::Stopped { sig, .. } => {
                    // A signal-delivery stop before ours: let it be delivered, then we stop.
                    ptrace(libc::PTRACE_CONT, tid, 0, sig as usize).map_err(|e| err("PTRACE_CONT", e))?;
                    ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0).map_err(|e| err("PTRACE_INTERRUPT", e))?;
                }
                Stop::Gone(how) => {
                    b.attached = false;
                    return Err(InjectError::Died { pid, how });
                }
            }
        }
        b.regs = b.get_regs()?;
        let mut iov = libc::iovec { iov_base: b.xstate.as_mut_ptr().cast(), iov_len: b.xstate.len() };
        ptrace(libc::PTRACE_GETREGSET, tid, NT_X86_XSTATE as usize, &mut iov as *mut libc::iovec as usize)
            .map_err(|e| err("PTRACE_GETREGSET NT_X86_XSTATE", e))?;
        b.xstate.truncate(iov.iov_len);
        Ok(b)
    }

    fn err(&self, what: &str, e: std::io::Error) -> InjectError {
        InjectError::Ptrace { pid: self.pid, what: format!("{what} (thread {}): {e}", self.tid) }
    }

    fn wait(&self) -> Result<Stop, InjectError> {
        let mut status = 0;
        loop {
            // SAFETY: waitpid writes the status into our local.
            let r = unsafe { libc::waitpid(self.tid, &mut status, libc::__WALL) };
            if r == -1 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.err("waitpid", e));
            }
            break;
        }
        if libc::WIFEXITED(status) {
            return Ok(Stop::Gone(format!("exited with status {}", libc::WEXITSTATUS(status))));
        }
        if libc::WIFSIGNALED(status) {
            return Ok(Stop::Gone(format!("killed by signal {}", libc::WTERMSIG(status))));
        }
        Ok(Stop::Stopped { sig: libc::WSTOPSIG(status), event: (status >> 16) & 0xff })
    }

    fn get_regs(&self) -> Result<libc::user_regs_struct, InjectError> {
        let mut regs = zeroed_regs();
        ptrace(libc::PTRACE_GETREGS, self.tid, 0, &mut regs as *mut _ as usize)
            .map_err(|e| self.err("PTRACE_GETREGS", e))?;
        Ok(regs)
    }

    fn set_regs(&self, regs: &libc::user_regs_struct) -> Result<(), InjectError> {
        ptrace(libc::PTRACE_SETREGS, self.tid, 0, regs as *const _ as usize)
            .map_err(|e| self.err("PTRACE_SETREGS", e))?;
        Ok(())
    }

    fn write(&self, addr: u64, data: &[u8]) -> Result<(), InjectError> {
        let local = libc::iovec { iov_base: data.as_ptr() as *mut libc::c_void, iov_len: data.len() };
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: data.len() };
        // SAFETY: one local buffer we own, read by the kernel; the remote range is checked by
        // the kernel against the target's mappings.
        let n = unsafe { libc::process_vm_writev(self.tid, &local, 1, &remote, 1, 0) };
        if n != data.len() as isize {
            return Err(
                self.err(&format!("writing {} bytes at {addr:#x}", data.len()), std::io::Error::last_os_error())
            );
        }
        Ok(())
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<usize, InjectError> {
        let len = buf.len();
        let mut local = [IoSliceMut::new(buf)];
        let remote = libc::iovec { iov_base: addr as *mut libc::c_void, iov_len: len };
        // SAFETY: IoSliceMut has iovec's layout; the kernel writes at most `len` bytes into our
        // buffer and checks the remote range against the target's mappings.
        let n = unsafe { libc::process_vm_readv(self.tid, local.as_mut_ptr().cast(), 1, &remote, 1, 0) };
        if n < 0 {
            return Err(self.err(&format!("reading at {addr:#x}"), std::io::Error::last_os_error()));
        }
        Ok(n as usize)
    }

    /// A NUL-terminated string of the target (at most `max` bytes).
    pub fn read_cstring(&self, addr: u64, max: usize) -> Result<String, InjectError> {
        let mut out = Vec::new();
        let mut chunk = [0u8; 256];
        while out.len() < max {
            // Never across a page boundary in one read: the next page may be unmapped.
            let page_left = 4096 - ((addr as usize + out.len()) % 4096);
            let n = self.read(addr + out.len() as u64, &mut chunk[..page_left.min(256)])?;
            if n == 0 {
                break;
            }
            if let Some(z) = chunk[..n].iter().position(|&b| b == 0) {
                out.extend_from_slice(&chunk[..z]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&chunk[..n]);
        }
        Ok(String::from_utf8_lossy(&out).into_owned())
    }

    /// Calls `func(args...)` on the thread (System V: up to six integer arguments) and returns
    /// its `rax`. Byte arguments are copied below the thread's red zone; the call's stack is
    /// below them, 16-byte aligned at the call, with a return address of 0.
    pub fn call(&mut self, func: u64, args: &[Arg<'_>]) -> Result<u64, InjectError> {
        assert!(args.len() <= 6, "at most six register arguments");
        let mut sp = self.regs.rsp.wrapping_sub(RED_ZONE);
        let mut words = [0u64; 6];
        for (i, a) in args.iter().enumerate() {
            words[i] = match *a {
                Arg::Word(w) => w,
                Arg::Bytes(b) => {
                    sp = (sp - b.len() as u64) & !0xf;
                    self.write(sp, b)?;
                    sp
                }
            };
        }
        // At the function's first instruction, rsp + 8 is 16-byte aligned.
        sp = (sp & !0xf) - 8;
        self.write(sp, &0u64.to_le_bytes())?;
        let mut r = self.regs;
        r.rip = func;
        r.rsp = sp;
        r.rax = 0;
        // Not in a system call any more: no restart of the interrupted one on this resume.
        r.orig_rax = u64::MAX;
        (r.rdi, r.rsi, r.rdx, r.rcx, r.r8, r.r9) = (words[0], words[1], words[2], words[3], words[4], words[5]);
        self.set_regs(&r)?;
        let mut deliver = 0;
        loop {
            ptrace(libc::PTRACE_CONT, self.tid, 0, deliver as usize).map_err(|e| self.err("PTRACE_CONT", e))?;
            deliver = 0;
            match self.wait()? {
                Stop::Stopped { sig: libc::SIGSEGV, event: 0 } => {
                    let now = self.get_regs()?;
                    if now.rip == 0 {
                        return Ok(now.rax);
                    }
                    // A real fault inside the call: put the thread back as it was rather than
                    // let the target die of our call.
                    return Err(self.err(
                        &format!("the call of {func:#x} faulted at {:#x}", now.rip),
                        std::io::Error::other("SIGSEGV"),
                    ));
                }
                // A group stop or our own interrupt: go on.
                Stop::Stopped { event, .. } if event != 0 => {}
                // Another signal for this thread: delivered (its handler runs inside the call).
                Stop::Stopped { sig, .. } => deliver = sig,
                Stop::Gone(how) => {
                    self.attached = false;
                    return Err(InjectError::Died { pid: self.pid, how });
                }
            }
        }
    }

    /// Puts the registers and FP state back and lets the thread go (a system call it was
    /// blocked in is restarted by the kernel).
    pub fn release(mut self) -> Result<(), InjectError> {
        self.restore()
    }

    fn restore(&mut self) -> Result<(), InjectError> {
        if !self.attached {
            return Ok(());
        }
        self.attached = false;
        let mut iov = libc::iovec { iov_base: self.xstate.as_mut_ptr().cast(), iov_len: self.xstate.len() };
        let fp =
            ptrace(libc::PTRACE_SETREGSET, self.tid, NT_X86_XSTATE as usize, &mut iov as *mut libc::iovec as usize);
        let regs = self.set_regs(&resumed_in_syscall(self.regs));
        let detach = ptrace(libc::PTRACE_DETACH, self.tid, 0, 0);
        fp.map_err(|e| self.err("PTRACE_SETREGSET NT_X86_XSTATE", e))?;
        regs?;
        detach.map_err(|e| self.err("PTRACE_DETACH", e))?;
        Ok(())
    }
}

impl Drop for Borrowed {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}

/// The kernel's "restart the interrupted call" codes (never seen by user space).
const ERESTARTSYS: i64 = -512;
const ERESTARTNOINTR: i64 = -513;
const ERESTARTNOHAND: i64 = -514;
const ERESTART_RESTARTBLOCK: i64 = -516;

/// The registers a thread interrupted in a system call resumes with: at the `syscall`
/// instruction again, with the call's number, as if it had never been interrupted. Left to
/// the kernel, the restart would depend on what happened on the thread in between: a signal
/// handled there (the agent that was just loaded may signal the thread while it patches
/// code) turns `ERESTARTNOHAND`, `ERESTART_RESTARTBLOCK` and `ERESTARTSYS` without
/// `SA_RESTART` into `EINTR` for the program. Made again from the start, the call cannot
/// fail that way (a sleep or a poll timeout starts over with its full length, where the
/// kernel's restart would use what remained).
fn resumed_in_syscall(mut regs: libc::user_regs_struct) -> libc::user_regs_struct {
    let in_syscall = (regs.orig_rax as i64) >= 0;
    if in_syscall && matches!(regs.rax as i64, ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK) {
        // `syscall` (0f 05) is two bytes; the kernel's own restart steps back the same way.
        regs.rip = regs.rip.wrapping_sub(2);
        regs.rax = regs.orig_rax;
        regs.orig_rax = u64::MAX;
    }
    regs
}

/// An all-zero `user_regs_struct`.
fn zeroed_regs() -> libc::user_regs_struct {
    // SAFETY: user_regs_struct is plain integers, for which all-zero is a valid value.
    unsafe { std::mem::zeroed() }
}
