fn main() {
    eprintln!("provium: not implemented yet");
    std::process::exit(2);
}
