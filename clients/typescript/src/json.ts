// JSON text to values with integers kept exact: JSON.parse reads 18446744073709551615 as
// 18446744073709552000, and airlock sends ints up to 2^64 - 1 as plain JSON numbers.

// A run of 16 or more digits that could be a whole integer literal (not a fraction's or an
// exponent's digits, not followed by either); all integers of 15 digits are safe. A match in a
// string only costs the slower parser.
const LONG_INTEGER = /(?<![\d.eE+]|[eE]-)\d{16}(?![.eE])/;
// A number JSON.parse would read as an infinity, or one of thousands of digits: an exponent of
// three digits or more, a run of digits longer than the longest number read.
const HUGE_NUMBER = /[eE][+-]?\d{3}|\d{4301}/;
// The longest number literal read, as Python's int() reads at most 4300 digits by default.
const MAX_NUMBER_CHARS = 4300;

/**
 * Parses JSON text as `JSON.parse` does, except that an integer (a number written without a
 * fraction or an exponent) outside ±(2^53 - 1) is a `bigint`, exactly, and a number too large
 * for a float (`1e999`) or of more than 4300 characters is refused. Text with no integer of 16
 * digits or more and no such number goes to `JSON.parse` itself; other text to a parser of
 * its own, a few times slower. A malformed text throws a `SyntaxError`.
 */
export function parseJson(text: string): unknown {
  if (!LONG_INTEGER.test(text) && !HUGE_NUMBER.test(text)) return JSON.parse(text);
  return new Parser(text).document();
}

const enum Ch {
  Tab = 9,
  Newline = 10,
  Return = 13,
  Space = 32,
  Quote = 34,
  Comma = 44,
  Minus = 45,
  Zero = 48,
  Nine = 57,
  Colon = 58,
  OpenBracket = 91,
  Backslash = 92,
  CloseBracket = 93,
  OpenBrace = 123,
  CloseBrace = 125,
}

const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;

// An open array, or an object with the key its next value goes under.
type Open = { array: unknown[] } | { object: Record<string, unknown>; key: string };

class Parser {
  private at = 0;

  constructor(private readonly text: string) {}

  private fail(what: string): never {
    throw new SyntaxError(`${what} in JSON at position ${this.at}`);
  }

  private space(): number {
    const text = this.text;
    let c = text.charCodeAt(this.at);
    while (c === Ch.Space || c === Ch.Newline || c === Ch.Return || c === Ch.Tab) c = text.charCodeAt(++this.at);
    return c;
  }

  private expect(c: number, what: string): void {
    if (this.space() !== c) this.fail(`expected ${what}`);
    this.at++;
  }

  // Iterative, so that no nesting overflows the stack.
  document(): unknown {
    const open: Open[] = [];
    for (;;) {
      let value: unknown;
      const c = this.space();
      if (c === Ch.OpenBracket) {
        this.at++;
        if (this.space() !== Ch.CloseBracket) {
          open.push({ array: [] });
          continue;
        }
        this.at++;
        value = [];
      } else if (c === Ch.OpenBrace) {
        this.at++;
        if (this.space() !== Ch.CloseBrace) {
          open.push({ object: {}, key: this.key() });
          continue;
        }
        this.at++;
        value = {};
      } else {
        value = this.scalar(c);
      }
      // Close every container this value completes.
      for (;;) {
        const top = open[open.length - 1];
        if (top === undefined) {
          this.space();
          if (this.at < this.text.length) this.fail("unexpected text after the value");
          return value;
        }
        if ("array" in top) top.array.push(value);
        else put(top.object, top.key, value);
        const next = this.space();
        this.at++;
        if (next === Ch.Comma) {
          if (!("array" in top)) top.key = this.key();
          break;
        }
        if (next !== ("array" in top ? Ch.CloseBracket : Ch.CloseBrace)) {
          this.at--;
          this.fail("expected , or a closing bracket");
        }
        open.pop();
        value = "array" in top ? top.array : top.object;
      }
    }
  }

  private key(): string {
    if (this.space() !== Ch.Quote) this.fail("expected a string key");
    const key = this.string();
    this.expect(Ch.Colon, ":");
    return key;
  }

  private scalar(c: number): unknown {
    const text = this.text;
    if (c === Ch.Quote) return this.string();
    if (c === Ch.Minus || (c >= Ch.Zero && c <= Ch.Nine)) {
      NUMBER.lastIndex = this.at;
      const match = NUMBER.exec(text);
      if (match === null) this.fail("bad number");
      const literal = match[0];
      if (literal.length > MAX_NUMBER_CHARS) this.fail(`a number of more than ${MAX_NUMBER_CHARS} characters`);
      const number = Number(literal);
      const integer = match[1] === undefined && match[2] === undefined;
      if (!integer && !Number.isFinite(number)) this.fail("a number too large for a float");
      this.at += literal.length;
      if (integer && !Number.isSafeInteger(number)) return BigInt(literal);
      return number;
    }
    for (const [word, value] of WORDS) {
      if (text.startsWith(word, this.at)) {
        this.at += word.length;
        return value;
      }
    }
    return this.fail(this.at < text.length ? "unexpected character" : "unexpected end");
  }

  private string(): string {
    const text = this.text;
    const start = this.at + 1;
    let i = start;
    let plain = true;
    for (;;) {
      const c = text.charCodeAt(i);
      if (c === Ch.Quote) break;
      if (c === Ch.Backslash) {
        plain = false;
        i++;
      } else if (c < Ch.Space || Number.isNaN(c)) {
        this.at = i;
        this.fail(Number.isNaN(c) ? "unterminated string" : "a control character in a string");
      }
      i++;
    }
    this.at = i + 1;
    // Escapes are JSON.parse's to read: exactly JSON's, and fast.
    return plain ? text.slice(start, i) : (JSON.parse(text.slice(start - 1, i + 1)) as string);
  }
}

const WORDS: readonly (readonly [string, unknown])[] = [
  ["true", true],
  ["false", false],
  ["null", null],
];

/** Sets `key` on a parsed object as JSON.parse does: `"__proto__"` as an own property. */
export function put(object: Record<string, unknown>, key: string, value: unknown): void {
  if (key === "__proto__") {
    Object.defineProperty(object, key, { value, enumerable: true, writable: true, configurable: true });
  } else {
    object[key] = value;
  }
}
