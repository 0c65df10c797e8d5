//! The light vector-state save at function entries and returns: registers used at full width
//! (upper halves in use) survive handlers that clobber them, and a probe hit leaves upper
//! halves that were in their initial state in it (so the probed program's legacy SSE code pays
//! no AVX-SSE transition after a hit).

use std::ffi::c_void;
use std::ptr::null_mut;

use userbpf_hook::*;

std::arch::global_asm!(
    ".pushsection .text.userbpf_fpstate_test,\"ax\",@progbits",
    // void t_fp_store_ymm0(u8 dst[32]): stores ymm0 at dst.
    ".globl t_fp_store_ymm0",
    "t_fp_store_ymm0:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    vmovdqu ymmword ptr [rdi], ymm0",
    "    ret",
    // Returns with ymm0 all ones.
    ".globl t_fp_ret_ymm0",
    "t_fp_ret_ymm0:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    vpcmpeqd ymm0, ymm0, ymm0",
    "    ret",
    ".globl t_fp_nop",
    "t_fp_nop:",
    "    nop dword ptr [rax + rax * 1 + 0]",
    "    ret",
    ".popsection",
);

unsafe extern "C" {
    fn t_fp_store_ymm0(dst: *mut u8);
    fn t_fp_ret_ymm0();
    fn t_fp_nop();
}

/// Zeroes ymm0 and fills ymm1-7 with ones (their upper halves are then in use).
unsafe extern "C" fn clobber(_d: *mut c_void, _r: *mut PtRegs) -> u32 {
    // SAFETY: AVX is available (checked by the tests); the registers are declared clobbered.
    unsafe {
        std::arch::asm!(
            "vpxor ymm0, ymm0, ymm0", "vpcmpeqd ymm1, ymm1, ymm1", "vpcmpeqd ymm2, ymm2, ymm2",
            "vpcmpeqd ymm3, ymm3, ymm3", "vpcmpeqd ymm4, ymm4, ymm4", "vpcmpeqd ymm5, ymm5, ymm5",
            "vpcmpeqd ymm6, ymm6, ymm6", "vpcmpeqd ymm7, ymm7, ymm7",
            out("ymm0") _, out("ymm1") _, out("ymm2") _, out("ymm3") _, out("ymm4") _,
            out("ymm5") _, out("ymm6") _, out("ymm7") _,
        )
    };
    HOOK_CONTINUE
}

fn avx() -> bool {
    std::arch::is_x86_feature_detected!("avx")
}

/// XINUSE bits of the upper halves (YMM_Hi128, ZMM_Hi256) right after `f` returns, called
/// with them in their initial state; None when this CPU cannot tell.
fn upper_in_use_after(f: unsafe extern "C" fn()) -> Option<u32> {
    // CPUID leaf 0xD exists when xsave is available (AVX is, checked by the callers).
    if std::arch::x86_64::__cpuid_count(0xD, 1).eax & (1 << 2) == 0 {
        return None;
    }
    let (before, after): (u64, u32);
    // SAFETY: xgetbv(1) is supported (checked above); `f` follows the C ABI (declared clobbers).
    unsafe {
        std::arch::asm!(
            "vzeroupper", "mov ecx, 1", "xgetbv", "mov r12d, eax",
            "vzeroupper", "call {f}", "mov ecx, 1", "xgetbv",
            f = in(reg) f, out("r12") before, out("eax") after, out("ecx") _, out("edx") _,
            clobber_abi("C"),
        )
    };
    // A CPU may report a component in use although it is in its initial state.
    (before & 0x44 == 0).then_some(after & 0x44)
}

#[test]
fn full_width_arguments_and_return_values_survive_handlers() {
    if !avx() {
        return;
    }
    let e = attach(t_fp_store_ymm0 as unsafe extern "C" fn(*mut u8) as usize, ProbeKind::Entry, clobber, null_mut())
        .unwrap();
    let mut buf = [0u8; 32];
    // SAFETY: ymm0 = all ones (upper half in use) is t_fp_store_ymm0's argument; it writes 32
    // bytes to buf.
    unsafe {
        std::arch::asm!("vpcmpeqd ymm0, ymm0, ymm0", "call {f}", f = sym t_fp_store_ymm0,
            in("rdi") buf.as_mut_ptr(), clobber_abi("C"))
    };
    detach(e).unwrap();
    assert_eq!(buf, [0xff; 32], "ymm0 as the function got it, past an entry handler");

    let r = attach(t_fp_ret_ymm0 as unsafe extern "C" fn() as usize, ProbeKind::Return, clobber, null_mut()).unwrap();
    let mut out = [0u8; 32];
    // SAFETY: t_fp_ret_ymm0 returns ymm0, stored to `out` (32 bytes).
    unsafe {
        std::arch::asm!("call {f}", "vmovdqu ymmword ptr [{o}], ymm0", f = sym t_fp_ret_ymm0,
            o = in(reg) out.as_mut_ptr(), clobber_abi("C"))
    };
    detach(r).unwrap();
    assert_eq!(out, [0xff; 32], "the full-width return value, past a return handler");
}

#[test]
fn a_hit_leaves_unused_upper_halves_in_their_initial_state() {
    if !avx() {
        return;
    }
    let Some(unprobed) = upper_in_use_after(t_fp_nop) else { return };
    assert_eq!(unprobed, 0);
    let e = attach(t_fp_nop as unsafe extern "C" fn() as usize, ProbeKind::Entry, clobber, null_mut()).unwrap();
    let r = attach(t_fp_nop as unsafe extern "C" fn() as usize, ProbeKind::Return, clobber, null_mut()).unwrap();
    let got = upper_in_use_after(t_fp_nop);
    detach(e).unwrap();
    detach(r).unwrap();
    assert_eq!(got, Some(0), "XINUSE upper bits after a probed call whose handlers dirtied them");
}
