//! Compiles `csrc/longdouble.c`: INCRBYFLOAT's long double arithmetic, the
//! same C expressions redis-server runs (see that file).

fn main() {
    println!("cargo:rerun-if-changed=csrc/longdouble.c");
    cc::Build::new()
        .file("csrc/longdouble.c")
        .warnings(true)
        .compile("nibble_longdouble");
}
