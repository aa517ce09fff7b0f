/// A size as the config writes it (`256MiB`, `64KiB`, `1.5GiB`, `700B`):
/// for messages and pages a person reads, never a bare 268435456.
public func byteSizeText(_ bytes: Int) -> String {
    let units: [(Int, String)] = [(1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")]
    for (scale, name) in units where bytes >= scale {
        if bytes % scale == 0 { return "\(bytes / scale)\(name)" }
        // The tenth from the remainder (below the scale: no overflow).
        return "\(bytes / scale).\(bytes % scale * 10 / scale)\(name)"
    }
    return "\(bytes)B"
}
