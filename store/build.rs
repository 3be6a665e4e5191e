//! `refinery` embeds `migrations/` when the store compiles, but Cargo does
//! not know that directory is an input: without this, a new migration is
//! left out of builds until something else in the crate changes.
fn main() {
    println!("cargo:rerun-if-changed=../migrations");
}
