import HappyPathCore
import Testing

@Suite struct SecretTests {
    static let value = "hunter2-4f1e"

    struct Holder {
        var name = "api"
        var secret = Secret(SecretTests.value)
        var maybe: Secret? = Secret(SecretTests.value)
        var several = [Secret(SecretTests.value)]
    }

    @Test func everyWayOfPrintingShowsStars() {
        let s = Secret(Self.value)
        var dumped = ""
        dump(Holder(), to: &dumped)
        let printed = [
            "\(s)", s.description, s.debugDescription, String(describing: s), String(reflecting: s),
            "\(Holder())", String(reflecting: Holder()), dumped, "\([s])", "\(Optional(s) as Any)",
        ]
        for text in printed {
            #expect(!text.contains(Self.value), "leaked: \(text)")
        }
        #expect("\(s)" == "***")
        #expect("\(Holder())".contains("***"))
    }

    @Test func theValueIsReadOnlyByRevealing() {
        #expect(Secret(Self.value).reveal == Self.value)
        #expect(Secret("a") == Secret("a"))
        #expect(Secret("a") != Secret("b"))
    }
}
