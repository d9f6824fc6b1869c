import { describe, expect, it } from 'vitest';
import { printWelcome } from '../../src/server/start/welcome.js';

// `serve` prints the demo users' tokens only to a terminal: a pipe or a file is a log stream.

const URL = 'http://127.0.0.1:3000';
const TOKENS = {
  'alice@example.com': 'vct_alice_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa',
  'publisher@example.com': 'vct_publisher_pppppppppppppppppppppppppppppppppp',
};

function capture(isTTY: boolean) {
  let text = '';
  return {
    out: { isTTY, write: (chunk: string) => (text += chunk) },
    text: () => text,
  };
}

describe('printWelcome', () => {
  it.each([false, true])('to a pipe or file (json: %s): no token, no email', (json) => {
    const { out, text } = capture(false);
    printWelcome(out, URL, TOKENS, json);
    expect(text()).not.toMatch(/vct_|@example\.com/);
    if (json) expect(JSON.parse(text())).toEqual({ url: URL });
    else expect(text()).toContain('token create');
  });

  it("to a terminal: the users' curl lines; the publisher's token only with --json", () => {
    const human = capture(true);
    printWelcome(human.out, URL, TOKENS, false);
    expect(human.text()).toContain(TOKENS['alice@example.com']);
    expect(human.text()).not.toContain(TOKENS['publisher@example.com']);

    const json = capture(true);
    printWelcome(json.out, URL, TOKENS, true);
    expect(JSON.parse(json.text())).toEqual({ url: URL, tokens: TOKENS });
  });

  it('to a terminal: the clinics users get the clinics app, the per-recipient run and their outbox', () => {
    const { out, text } = capture(true);
    const nora = 'vct_nora_nnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnnn';
    printWelcome(out, URL, { ...TOKENS, 'nora@example.com': nora }, false);
    expect(text()).toContain(`/api/w/demo/apps/clinics/run -H 'authorization: Bearer ${nora}'`);
    // A batch is the publisher's to start: the line says so, and never carries a user's token.
    const batchLine = text()
      .split('\n')
      .find((line) => line.includes('/api/w/demo/apps/clinics/runs/per-recipient'));
    expect(batchLine).toContain('"authorization: Bearer $PUBLISHER_TOKEN"');
    expect(batchLine).not.toContain(nora);
    expect(text()).toContain('token create --user publisher@example.com');
    expect(text()).toContain(`/api/w/demo/outbox -H 'authorization: Bearer ${nora}'`);
  });
});
