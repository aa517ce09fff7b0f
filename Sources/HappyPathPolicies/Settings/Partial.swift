/// A policy's configuration: one struct whose fields start at their
/// documented defaults, so `init()` is "nothing configured". The same struct
/// is what the policy runs with and, inside a `Partial`, what one level of
/// the file sets.
public protocol PolicyConfiguration: Sendable, Equatable {
    init()
}

/// The fields of a `PolicyConfiguration` one level of the file sets:
/// `defaults`, an upstream, or a route. A field this level does not set is
/// "not set", which is not its default: a route's unset `retry.attempts`
/// takes its upstream's, that one's unset takes `defaults`', and only a
/// field no level sets gets the configuration's own default. nginx keeps the
/// same two apart (`NGX_CONF_UNSET` in a module's `create_conf`, settled in
/// its `merge_conf`); here `merged(over:)` is that merge and `resolved()`
/// puts the defaults under what is left.
///
/// Reading a field through the partial (`retry.attempts`) gives its value
/// if this level sets it, nil if not.
@dynamicMemberLookup
public struct Partial<Configuration: PolicyConfiguration>: Sendable, Equatable {
    /// One set field: which, and how to write its value into a configuration.
    private struct Field: Sendable {
        let key: PartialKeyPath<Configuration> & Sendable
        let write: @Sendable (inout Configuration) -> Void
    }

    /// At most one per key; a handful, so a list beats a table.
    private var fields: [Field] = []

    public init() {}

    /// Sets a field (again: the later value wins). A nil `value` (one the
    /// loader refused, or a key the file leaves out) leaves it as it was.
    public mutating func set<Value: Sendable>(
        _ keyPath: WritableKeyPath<Configuration, Value> & Sendable, _ value: Value?
    ) {
        guard let value else { return }
        fields.removeAll { $0.key == keyPath }
        // Written through the key path, so the configuration's property
        // observers run (`retry.on` keeps its `statuses` in step).
        fields.append(Field(key: keyPath, write: { $0[keyPath: keyPath] = value }))
    }

    /// Nothing is set at this level.
    public var isEmpty: Bool { fields.isEmpty }

    public func isSet(_ keyPath: PartialKeyPath<Configuration>) -> Bool { fields.contains { $0.key == keyPath } }

    /// The field's value if this level sets it, else nil.
    public subscript<Value>(dynamicMember keyPath: KeyPath<Configuration, Value>) -> Value? {
        isSet(keyPath) ? resolved()[keyPath: keyPath] : nil
    }

    /// `self` over `base`: each field set here wins, the others come from `base`.
    public func merged(over base: Partial) -> Partial {
        var out = base
        for field in fields {
            out.fields.removeAll { $0.key == field.key }
            out.fields.append(field)
        }
        return out
    }

    /// The configuration with the fields set here, and the defaults elsewhere.
    public func resolved() -> Configuration {
        var configuration = Configuration()
        for field in fields { field.write(&configuration) }
        return configuration
    }

    /// The same fields set, to the same values.
    public static func == (a: Partial, b: Partial) -> Bool {
        a.fields.count == b.fields.count && a.fields.allSatisfy { b.isSet($0.key) } && a.resolved() == b.resolved()
    }
}
