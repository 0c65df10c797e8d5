//! What libbpf 1.1 accepts in an object and a user-space runtime cannot do is refused with
//! the feature named (the other features are tested where they work: objects.rs, and the
//! runtime's tests/loading.rs).

mod common;

use common::{compile, obj_name};
use userbpf_object::Object;

#[test]
fn struct_ops_maps_are_refused_by_name() {
    let src = "bad/struct_ops.bpf.c";
    let e = Object::parse(&compile(src), &obj_name(src)).err().expect("refused").to_string();
    assert!(
        e.starts_with("struct_ops.bpf.o: section .struct_ops: map `my_ops_table`: struct_ops maps hand programs to a kernel subsystem"),
        "{e}"
    );
}
