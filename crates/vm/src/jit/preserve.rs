//! The call JIT code makes out of a run that must not change the vector registers (runs
//! entered through the claiming entry, which a probe's stub calls without saving them, see
//! `compile.rs`, "Calls out of claimed runs").
//!
//! `userbpf_vm_preserving_call` is called with the arguments in rdi, rsi, rdx, rcx, r8 and the
//! function in r11, on a 16-byte aligned stack: it keeps vector registers 0-7 at their full
//! width (zmm with AVX-512, ymm with AVX, else xmm) around the call and returns what the
//! function returned. Registers 0-7 are those the System V ABI lets be live at a function's
//! entry (arguments) and, of them, 0-1 at its return: what a probe's lean path promises to
//! keep (`userbpf_hook::LeanHandler`). MXCSR and the x87 state are left alone (compiled code
//! does not change them), as every other vector and opmask register (dead at entries and
//! returns). Only taken on the slow paths (a memo miss, a cache refill), so it saves whole
//! registers without asking whether their upper halves are in use.

use std::sync::atomic::{AtomicU8, Ordering};

/// 0: SSE (xmm), 1: AVX (ymm), 2: AVX-512 (zmm): what the OS enabled (XCR0).
static VEC_MODE: AtomicU8 = AtomicU8::new(0);

std::arch::global_asm!(
    ".pushsection .text.userbpf_vm_preserving_call,\"ax\",@progbits",
    ".globl userbpf_vm_preserving_call",
    ".hidden userbpf_vm_preserving_call",
    ".type userbpf_vm_preserving_call,@function",
    ".p2align 4",
    "userbpf_vm_preserving_call:",
    "push rbp",
    "mov rbp, rsp",
    "sub rsp, 576",
    "and rsp, -64",
    "movzx eax, byte ptr [rip + {mode}]",
    "cmp eax, 2",
    "je 3f",
    "cmp eax, 1",
    "je 2f",
    "movdqa xmmword ptr [rsp], xmm0",
    "movdqa xmmword ptr [rsp + 16], xmm1",
    "movdqa xmmword ptr [rsp + 32], xmm2",
    "movdqa xmmword ptr [rsp + 48], xmm3",
    "movdqa xmmword ptr [rsp + 64], xmm4",
    "movdqa xmmword ptr [rsp + 80], xmm5",
    "movdqa xmmword ptr [rsp + 96], xmm6",
    "movdqa xmmword ptr [rsp + 112], xmm7",
    "call r11",
    "movdqa xmm0, xmmword ptr [rsp]",
    "movdqa xmm1, xmmword ptr [rsp + 16]",
    "movdqa xmm2, xmmword ptr [rsp + 32]",
    "movdqa xmm3, xmmword ptr [rsp + 48]",
    "movdqa xmm4, xmmword ptr [rsp + 64]",
    "movdqa xmm5, xmmword ptr [rsp + 80]",
    "movdqa xmm6, xmmword ptr [rsp + 96]",
    "movdqa xmm7, xmmword ptr [rsp + 112]",
    "jmp 4f",
    "2:",
    "vmovdqa ymmword ptr [rsp], ymm0",
    "vmovdqa ymmword ptr [rsp + 32], ymm1",
    "vmovdqa ymmword ptr [rsp + 64], ymm2",
    "vmovdqa ymmword ptr [rsp + 96], ymm3",
    "vmovdqa ymmword ptr [rsp + 128], ymm4",
    "vmovdqa ymmword ptr [rsp + 160], ymm5",
    "vmovdqa ymmword ptr [rsp + 192], ymm6",
    "vmovdqa ymmword ptr [rsp + 224], ymm7",
    "vzeroupper",
    "call r11",
    "vmovdqa ymm0, ymmword ptr [rsp]",
    "vmovdqa ymm1, ymmword ptr [rsp + 32]",
    "vmovdqa ymm2, ymmword ptr [rsp + 64]",
    "vmovdqa ymm3, ymmword ptr [rsp + 96]",
    "vmovdqa ymm4, ymmword ptr [rsp + 128]",
    "vmovdqa ymm5, ymmword ptr [rsp + 160]",
    "vmovdqa ymm6, ymmword ptr [rsp + 192]",
    "vmovdqa ymm7, ymmword ptr [rsp + 224]",
    "jmp 4f",
    "3:",
    "vmovdqa64 zmmword ptr [rsp], zmm0",
    "vmovdqa64 zmmword ptr [rsp + 64], zmm1",
    "vmovdqa64 zmmword ptr [rsp + 128], zmm2",
    "vmovdqa64 zmmword ptr [rsp + 192], zmm3",
    "vmovdqa64 zmmword ptr [rsp + 256], zmm4",
    "vmovdqa64 zmmword ptr [rsp + 320], zmm5",
    "vmovdqa64 zmmword ptr [rsp + 384], zmm6",
    "vmovdqa64 zmmword ptr [rsp + 448], zmm7",
    "vzeroupper",
    "call r11",
    "vmovdqa64 zmm0, zmmword ptr [rsp]",
    "vmovdqa64 zmm1, zmmword ptr [rsp + 64]",
    "vmovdqa64 zmm2, zmmword ptr [rsp + 128]",
    "vmovdqa64 zmm3, zmmword ptr [rsp + 192]",
    "vmovdqa64 zmm4, zmmword ptr [rsp + 256]",
    "vmovdqa64 zmm5, zmmword ptr [rsp + 320]",
    "vmovdqa64 zmm6, zmmword ptr [rsp + 384]",
    "vmovdqa64 zmm7, zmmword ptr [rsp + 448]",
    "4:",
    "mov rsp, rbp",
    "pop rbp",
    "ret",
    ".size userbpf_vm_preserving_call, . - userbpf_vm_preserving_call",
    ".popsection",
    mode = sym VEC_MODE,
);

unsafe extern "C" {
    fn userbpf_vm_preserving_call();
}

/// The thunk's address, after recording which registers this machine has (once).
pub(crate) fn address() -> u64 {
    let mode = if std::arch::is_x86_feature_detected!("avx512f") {
        2
    } else if std::arch::is_x86_feature_detected!("avx") {
        1
    } else {
        0
    };
    VEC_MODE.store(mode, Ordering::Relaxed);
    userbpf_vm_preserving_call as *const () as usize as u64
}
