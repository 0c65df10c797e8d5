//! What libbpf 1.1 accepts in an object and a user-space runtime cannot do is refused with
//! the feature named (the other features are tested where they work: objects.rs, and the
//! runtime's tests/loading.rs).

mod common;

use common::{compile, obj_name};
use userbpf_object::Object;

#[test]
fn struct_ops_maps_are_refused_by_name() {
    let src = "bad/struct_ops.bpf.c";
    let e = Object::parse(&compile(src), &obj_name(src)).map(|_| ()).expect_err("refused").to_string();
    assert!(
        e.starts_with("struct_ops.bpf.o: section .struct_ops: map `my_ops_table`: struct_ops maps hand programs to a kernel subsystem"),
        "{e}"
    );
}

fn refused(src: &str) -> String {
    Object::parse(&compile(src), &obj_name(src)).err().unwrap_or_else(|| panic!("{src} was accepted")).to_string()
}

#[test]
fn map_attributes_libbpf_does_not_know_are_refused() {
    assert_eq!(refused("bad/pinning.bpf.c"), "pinning.bpf.o: section .maps: map `odd_pin`: invalid pinning value 2");
    assert_eq!(
        refused("bad/unknown_field.bpf.c"),
        "unknown_field.bpf.o: section .maps: map `odd_field`: unknown field `prealloc_pages`"
    );
}

#[test]
fn kernel_symbols_strong_are_refused_weak_resolve_to_zero() {
    let e = refused("bad/ksym_typeless.bpf.c");
    assert!(
        e.starts_with(
            "ksym_typeless.bpf.o: extern `init_task`: __ksym kernel symbols are resolved against the running kernel"
        ),
        "{e}"
    );
    let o = Object::parse(&compile("ksyms_weak.bpf.c"), "ksyms_weak.bpf.o").unwrap();
    let p = o.program("p").unwrap();
    // Both addresses are `lddw rX, 0` (no map, no relocation left); the third load is `where`.
    let lddws: Vec<_> = p
        .insns
        .iter()
        .enumerate()
        .filter(|(_, i)| i.is_lddw())
        .map(|(n, i)| (i.src, i.imm, p.insns[n + 1].imm))
        .collect();
    assert_eq!(lddws.iter().filter(|l| **l == (0, 0, 0)).count(), 2, "{lddws:?}");
    assert_eq!(lddws.len(), 3, "{lddws:?}");
}
