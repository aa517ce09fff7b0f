import HappyPathCore
import HappyPathPolicies
import Testing

@Suite struct SecretScrubberTests {
    @Test(arguments: [
        ("raw", #"{"auth":"Bearer ab/c+d=e"}"#),
        ("token without its scheme", #"{"msg":"bad token ab/c+d=e"}"#),
        ("JSON-escaped slash", #"{"auth":"Bearer ab\/c+d=e"}"#),
        ("form-encoded", #"{"form":"t=ab%2Fc%2Bd%3De"}"#),
        ("form-encoded, lowercase escapes", #"{"form":"t=ab%2fc%2bd%3de"}"#),
    ])
    func replacesEveryFormOfAToken(_ what: String, _ text: String) {
        let scrubbed = SecretScrubber([Secret("Bearer ab/c+d=e")]).scrub(text)
        #expect(!scrubbed.contains("ab"), "\(what): \(scrubbed)")
        #expect(scrubbed.contains("***"), "\(what)")
    }

    @Test func replacesTheWholeCredentialNotJustTheToken() {
        #expect(SecretScrubber([Secret("Bearer tok-123456")]).scrub("h: Bearer tok-123456.") == "h: ***.")
    }

    @Test func decodesABasicCredential() {
        // "user:pa55/word" in base64.
        let scrubber = SecretScrubber([Secret("Basic dXNlcjpwYTU1L3dvcmQ=")])
        #expect(scrubber.scrub("got dXNlcjpwYTU1L3dvcmQ=") == "got ***")
        #expect(scrubber.scrub("got user:pa55/word") == "got ***")
        #expect(scrubber.scrub("password pa55\\/word") == "password ***")
    }

    @Test func searchesForALoginBodysFieldsButNotShortOnes() {
        let body = #"{"user":"ops","password":"hunter2/x"}"#
        let scrubber = SecretScrubber([Secret(body)], pieces: SecretScrubber.values(inBody: body))
        #expect(scrubber.scrub("wrong password hunter2/x for ops") == "wrong password *** for ops")
        #expect(SecretScrubber.values(inBody: "user=ops&password=a%2Fb+c") == ["ops", "a/b c"])
    }

    @Test func keepsUpstreamBodyValidJSONOrLeavesItOut() {
        var p = Problem(.upstreamUnavailable, requestID: "r", detail: "echo: s3cr3t")
        p.upstreamBodyJSON = #"{"headers":{"authorization":"Bearer s3cr3t"}}"#
        let clean = p.scrubbed(by: SecretScrubber([Secret("Bearer s3cr3t")]))
        #expect(clean.upstreamBodyJSON == #"{"headers":{"authorization":"***"}}"#)
        #expect(clean.detail == "echo: ***")
        // A one-letter secret matches inside `\n`: the body would break, so it goes.
        p.upstreamBodyJSON = #"{"a":"x\ny"}"#
        #expect(p.scrubbed(by: SecretScrubber([Secret("n")])).upstreamBodyJSON == nil)
        // Nothing found: the body is kept as it was.
        #expect(p.scrubbed(by: SecretScrubber([Secret("zzz")])).upstreamBodyJSON == #"{"a":"x\ny"}"#)
    }
}
