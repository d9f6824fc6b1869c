/** The demo's workspace and people (the orders world's; the clinics world has its own users). */
export const DEMO_WORKSPACE = 'demo';
export const DEMO_PUBLISHER = 'publisher@example.com';
export const DEMO_USERS = {
  'alice@example.com': ['emea'],
  'bob@example.com': ['amer'],
  'carol@example.com': ['emea', 'amer'],
  'dave@example.com': [],
} as const;
