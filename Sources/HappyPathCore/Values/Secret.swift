/// A credential from the configuration or a token endpoint: a client
/// secret, a refresh token, a password, an access token.
///
/// Secrets reach logs by accident, through a `"\(settings)"` in a message,
/// a `dump` while debugging, or a struct printed whole. A `Secret` prints
/// as `***` in every one of those (interpolation, `description`,
/// `debugDescription`, reflection), wherever it is nested, so such an
/// accident shows nothing. Its value is read only through `reveal`, which
/// names the few places that must send it somewhere and is easy to find.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible, CustomReflectable {
    private let value: String

    public init(_ value: String) { self.value = value }

    /// The value itself: only for putting it where it belongs (a token
    /// request, an injected header), never into a message.
    public var reveal: String { value }

    public var description: String { "***" }
    public var debugDescription: String { "***" }
    /// No children: `dump` and other mirror-based printing see nothing inside.
    public var customMirror: Mirror { Mirror(self, children: [], displayStyle: .struct) }
}
