/// A certificate and its private key, as files (PEM; the certificate file
/// may hold the chain after it).
public struct CertificatePair: Sendable, Equatable {
    public var cert: String
    public var key: String

    public init(cert: String, key: String) {
        self.cert = cert
        self.key = key
    }
}
