fn main() {
    println!("{}", moeplug::version());
}
