fn main() {
    std::process::exit(provium::cli::main());
}
